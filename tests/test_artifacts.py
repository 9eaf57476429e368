"""artifacts/: one facts schema for every shipped kind, one table of targets, one verified unpack."""

from __future__ import annotations

import json

import pytest

from artifacts import facts, files, targets
from maintain.kinds import KINDS


def test_every_shipped_artifact_has_the_same_facts_keys_and_is_made_by_the_one_command():
    found = sorted(facts.SHIPPED.glob("*/*/*/" + facts.FACTS))
    assert len(found) == sum(len(kind.NAMES) * len(kind.LEVELS) for kind in KINDS.values())
    for path in found:
        shipped = json.loads(path.read_text())
        assert tuple(shipped) == facts.KEYS, path
        kind, name, level = path.parent.relative_to(facts.SHIPPED).parts
        assert (shipped["kind"], shipped["name"], shipped["level"]) == (kind, name, level)
        assert kind in KINDS and shipped["made_by"].startswith("python -m maintain make")
        assert shipped["target"] == targets.TARGETS[level].cpu
        assert all(set(f) == {"name", "packed", "bytes", "sha256"} for f in shipped["files"]), path


def test_facts_of_another_shape_are_refused(tmp_path):
    with pytest.raises(ValueError, match="keys"):
        facts.write(tmp_path, {"kind": "app-graph"})
    (tmp_path / facts.FACTS).write_text(json.dumps({"model": "demo", "max": "26.7.0"}))  # an older schema
    assert facts.read(tmp_path) is None


def test_the_shipped_levels_are_rows_of_the_one_table():
    assert set(targets.SHIPPED) == {"x86-64-v3", "neoverse-n1"}
    assert {kind.LEVELS for kind in KINDS.values()} <= {tuple(targets.SHIPPED), ("x86-64-v3",)}
    assert targets.TARGETS["x86-64-v3"].features() < targets.TARGETS["x86-64-v4-vnni"].features()
    assert "avx512_vnni" in targets.TARGETS["x86-64-v4-vnni"].features()
    assert targets.TARGETS["sm_90a"].features() == frozenset() and not targets.TARGETS["sm_90a"].shipped


def test_an_unpack_checks_every_byte_once_and_sizes_after(tmp_path, capsys):
    source = tmp_path / "made"
    source.mkdir()
    (source / "a.mef").write_bytes(b"a" * 1000)
    (source / "manifest.json").write_text("{}")
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    files.pack_xz(source / "a.mef", shipped / "a.mef.xz")
    (shipped / "manifest.json").write_text("{}")
    listed = [files.entry(source / "a.mef", "a.mef.xz"), files.entry(source / "manifest.json", "manifest.json")]
    folder = files.unpack(shipped, listed, tmp_path / "cache" / "x")
    assert folder is not None and (folder / "a.mef").read_bytes() == b"a" * 1000
    (folder / "a.mef").write_bytes(b"b" * 1000)  # the same size, other bytes: found by its size, as it is
    assert files.unpack(shipped, listed, folder) == folder
    (folder / "a.mef").write_bytes(b"b" * 10)  # cut short: set aside, unpacked again and checked
    assert files.unpack(shipped, listed, folder) == folder and (folder / "a.mef").read_bytes() == b"a" * 1000
    assert "set aside" in capsys.readouterr().err
    wrong = [{**listed[0], "sha256": "0" * 64}, listed[1]]  # shipped bytes that are not the facts' ones
    assert files.unpack(shipped, wrong, tmp_path / "cache" / "y") is None
    assert not (tmp_path / "cache" / "y").exists()
