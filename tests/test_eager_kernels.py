"""MAX's eager kernels shipped for the course's checks (checker/eager_kernels/):
a first check on empty caches compiles nothing where the CPU can run them,
and the checker loads nothing (and compiles as before) where it cannot."""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

import pytest
from conftest import run_python

from checker import eager_kernels
from checker.eager_kernels.__main__ import COMPILED_NOTE, empty_caches_env, pack
from model import cpu
from model.portable import FEATURES

FACTS = eager_kernels.shipped_facts()


def test_the_archive_holds_the_indexed_kernels_and_the_licence():
    with tarfile.open(eager_kernels.ARCHIVE, "r:xz") as archive:
        names = archive.getnames()
    assert names == sorted(kernel["file"] for kernel in FACTS["kernels"]) and names
    assert all(name.endswith(".mef") for name in names)
    assert FACTS["level"] == eager_kernels.LEVEL
    assert all(step["passed"] for step in FACTS["first_checks_in_one_process"])
    assert (eager_kernels.HERE / "NOTICE").is_file() and (eager_kernels.HERE / "MAX-LICENSE.txt").stat().st_size > 0


def test_a_cpu_or_max_they_cannot_serve_is_told_why(monkeypatch):
    for name in (eager_kernels.USE, "MAX_EAGER_EXECUTOR"):
        monkeypatch.delenv(name, raising=False)
    every = frozenset(FEATURES)
    if cpu.is_x86():
        assert eager_kernels.unusable_here(FACTS, every) == ""
        assert "avx2" in eager_kernels.unusable_here(FACTS, frozenset({"sse4_2", "avx"}))
    assert "MAX 0.0" in eager_kernels.unusable_here({**FACTS, "max": "0.0"}, every)
    assert eager_kernels.unusable_here(None, every) == "none are shipped"
    monkeypatch.setenv("MAX_EAGER_EXECUTOR", "interpreter")
    assert "MAX_EAGER_EXECUTOR" in eager_kernels.unusable_here(FACTS, every)
    monkeypatch.setenv(eager_kernels.USE, "0")
    assert eager_kernels.unusable_here(FACTS, every) == f"{eager_kernels.USE}=0"


def test_they_are_unpacked_once_into_the_project_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(eager_kernels.caches.CACHE, str(tmp_path))
    stale = tmp_path / "eager-kernels" / f"{eager_kernels.LEVEL}-0000000000000000"
    stale.mkdir(parents=True)
    folder = eager_kernels.unpacked(FACTS)
    assert folder.parent == tmp_path / "eager-kernels" and not stale.exists()  # an earlier archive's are dropped
    assert sorted(p.name for p in folder.iterdir()) == sorted(kernel["file"] for kernel in FACTS["kernels"])
    mark = folder / FACTS["kernels"][0]["file"]
    mark.write_bytes(b"kept")
    assert eager_kernels.unpacked(FACTS) == folder and mark.read_bytes() == b"kept"  # not unpacked again


def test_damaged_kernels_are_dropped_and_the_checks_compile_as_before(tmp_path, monkeypatch, capsys):
    if eager_kernels.unusable_here(FACTS):
        pytest.skip(f"not here: {eager_kernels.unusable_here(FACTS)}")
    monkeypatch.setenv(eager_kernels.caches.CACHE, str(tmp_path))
    folder = eager_kernels.unpacked(FACTS)
    for kernel in FACTS["kernels"]:
        (folder / kernel["file"]).write_bytes(b"not a MEF")
    eager_kernels.use.cache_clear()
    assert eager_kernels.use() == 0
    eager_kernels.use.cache_clear()
    assert "the shipped kernels were not loaded" in capsys.readouterr().err and not folder.exists()


def test_packing_is_the_same_bytes_for_the_same_files(tmp_path):
    files = []
    for name, data in (("b.mef", b"b" * 100), ("a.mef", b"a")):
        (tmp_path / name).write_bytes(data)
        files.append(tmp_path / name)
    first, second = tmp_path / "1.tar.xz", tmp_path / "2.tar.xz"
    pack(files, first)
    pack(files[::-1], second)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as archive:
        assert archive.getnames() == ["a.mef", "b.mef"]


@pytest.mark.skipif(bool(eager_kernels.unusable_here(FACTS)), reason=f"not here: {eager_kernels.unusable_here(FACTS)}")
def test_every_first_check_on_empty_caches_compiles_nothing():
    """The course's checks with the solutions, from empty caches, in one
    process: the shipped kernels are every kernel they meet. A change to a
    solution or a check that meets a new kernel fails here (the step's
    compile note says which) until ``python -m checker.eager_kernels make``
    writes the kernels again."""
    with tempfile.TemporaryDirectory(prefix="gpt2-first-check-") as empty:
        done = run_python("-m", "checker", "all", "--solution", "--no-color", env=empty_caches_env(Path(empty)))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert COMPILED_NOTE not in out, out
