"""MAX's eager kernels shipped with the project (checker/eager_kernels.py): on empty
caches nothing compiles where the CPU can run them, and nothing is offered (MAX
compiles as before) where it cannot."""

from __future__ import annotations

import importlib.metadata
import json
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
from conftest import run_python

from artifacts import atomic, files
from artifacts import facts as artifact_facts
from artifacts.mef import MANIFEST
from artifacts.targets import SHIPPED as TARGETS
from artifacts.targets import this_machines
from checker import eager_kernels
from maintain.eager_kernels import COMPILED_NOTE
from maintain.making import empty_caches_env
from model import cpu
from model import graph_source as portable
from model.graph_source import none_shipped_here
from model.max_internals import WARM_STORE, eager_families

FACTS = eager_kernels.shipped_facts()
NOT_HERE = eager_kernels.unusable_here(FACTS)


@pytest.fixture
def no_store(monkeypatch):
    """This process's environment without the store the suite named (tests/conftest.py)."""
    for name in (eager_kernels.USE, "MAX_EAGER_EXECUTOR", WARM_STORE):
        monkeypatch.delenv(name, raising=False)
    eager_kernels.use.cache_clear()
    yield
    eager_kernels.use.cache_clear()


@pytest.mark.parametrize("level", TARGETS)
def test_each_archive_holds_every_family_of_this_max_with_its_manifest_and_licence(level):
    """One archive per level the compiled graphs ship for: x86-64-v3's and Neoverse N1's."""
    target = TARGETS[level]
    facts = eager_kernels.shipped_facts(level)
    [archive_name] = {f["packed"] for f in facts["files"]}
    with tarfile.open(artifact_facts.folder(eager_kernels.KIND, eager_kernels.NAME, level) / archive_name) as archive:
        names = archive.getnames()
        manifest = json.load(archive.extractfile(MANIFEST))
    families = facts["made_from"]["families"]
    mefs = sorted(family["file"] for family in families)
    assert names == sorted([*mefs, MANIFEST]) == sorted(f["name"] for f in facts["files"])
    assert sorted(manifest["artifacts"]) == mefs and manifest["graphs"] == []  # MAX's MefStore layout
    assert sorted(family["family"] for family in families) == sorted(f.name for f in eager_families())
    assert facts["level"] == level and facts["target"] == target.cpu
    assert facts["max"] == importlib.metadata.version("max")
    assert (artifact_facts.SHIPPED / "NOTICE").is_file()


def test_a_cpu_max_or_gpu_they_cannot_serve_is_told_why(no_store, monkeypatch):
    if not this_machines():
        pytest.skip(none_shipped_here())
    every = TARGETS[FACTS["level"]].features()
    if cpu.is_x86():
        assert eager_kernels.unusable_here(FACTS, every, gpus=0) == ""
        assert "avx2" in eager_kernels.unusable_here(FACTS, frozenset({"sse4_2", "avx"}), gpus=0)
    assert "MAX 0.0" in eager_kernels.unusable_here({**FACTS, "max": "0.0"}, every, gpus=0)
    assert "GPU" in eager_kernels.unusable_here(FACTS, every, gpus=1)
    assert eager_kernels.unusable_here(None, every) == "none are shipped"
    monkeypatch.setenv(WARM_STORE, "/somewhere/else")
    assert "another store" in eager_kernels.unusable_here(FACTS, every, gpus=0)
    monkeypatch.delenv(WARM_STORE)
    monkeypatch.setenv("MAX_EAGER_EXECUTOR", "interpreter")
    assert "MAX_EAGER_EXECUTOR" in eager_kernels.unusable_here(FACTS, every, gpus=0)
    monkeypatch.setenv(eager_kernels.USE, "0")
    assert eager_kernels.unusable_here(FACTS, every, gpus=0) == f"{eager_kernels.USE}=0"
    assert eager_kernels.use() == 0 and WARM_STORE not in os.environ


def test_an_arm_machine_is_served_arm_s_kernels_and_not_x86_s(no_store, monkeypatch):
    """Each archive is refused on the other architecture, saying so; Arm's serves a Neoverse N1."""
    arm, x86 = (eager_kernels.shipped_facts(level) for level in ("neoverse-n1", "x86-64-v3"))
    monkeypatch.setattr(portable.platform, "system", lambda: "Linux")
    monkeypatch.setattr(portable.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(portable.cpu, "is_x86", lambda: False)
    every = TARGETS["neoverse-n1"].features()
    assert eager_kernels.unusable_here(arm, every, gpus=0) == ""
    assert eager_kernels.unusable_here(x86, every, gpus=0) == "Linux x86_64 code, this is Linux on aarch64"
    assert "lacks asimddp" in eager_kernels.unusable_here(arm, every - {"asimddp"}, gpus=0)


def test_a_machine_no_level_ships_for_is_told_so(no_store, monkeypatch):
    monkeypatch.setattr(portable.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(portable.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(portable.cpu, "is_x86", lambda: False)
    assert eager_kernels.unusable_here(FACTS, frozenset(), gpus=0) == \
        "none are shipped for Darwin on arm64 (Linux on x86-64-v3 or neoverse-n1 only)"


def test_arm_s_archive_unpacks_into_a_folder_of_its_level(tmp_path, no_store, monkeypatch):
    monkeypatch.setenv(eager_kernels.caches.CACHE, str(tmp_path))
    arm = eager_kernels.shipped_facts("neoverse-n1")
    folder = eager_kernels.unpacked(arm)
    assert folder is not None and folder.name.startswith(f"{eager_kernels.KIND}-neoverse-n1-")
    assert files.intact(folder, arm["files"], digests=True)


def test_they_are_unpacked_once_and_named_for_max(tmp_path, no_store, monkeypatch):
    monkeypatch.setenv(eager_kernels.caches.CACHE, str(tmp_path))
    level = tmp_path / "shipped" / f"{eager_kernels.KIND}-{eager_kernels.TARGET.name}"
    stale, in_use = (Path(f"{level}-{name}") for name in ("0000000000000000", "1111111111111111"))
    dead = level.parent / f"{atomic.STAGING}{2**22 + 1}@{atomic.socket.gethostname()}.x"
    for folder in (stale, in_use, dead):  # (no process has a pid above 2**22: Linux's pid_max is at most that)
        folder.mkdir(parents=True)
    week = 7 * 86400 + 60
    os.utime(stale, (stale.stat().st_atime - week,) * 2)
    folder = eager_kernels.unpacked(FACTS)
    assert folder.parent == tmp_path / "shipped"
    assert in_use.exists() and not stale.exists() and not dead.exists()  # another checkout's, used lately, stays
    assert sorted(p.name for p in folder.iterdir()) == sorted(f["name"] for f in FACTS["files"])
    made = (folder / MANIFEST).stat().st_ino
    assert eager_kernels.unpacked(FACTS) == folder and (folder / MANIFEST).stat().st_ino == made  # kept
    if not NOT_HERE:
        assert eager_kernels.use() == len(FACTS["made_from"]["families"]) and os.environ[WARM_STORE] == str(folder)


def test_a_name_of_ours_is_told_from_another_store_and_dropped_when_turned_off(tmp_path, no_store, monkeypatch):
    monkeypatch.setenv(eager_kernels.caches.CACHE, str(tmp_path))
    mine = tmp_path / "shipped" / f"{eager_kernels.KIND}-{eager_kernels.TARGET.name}-0123456789abcdef"
    assert eager_kernels.ours(str(mine))
    assert not eager_kernels.ours(str(tmp_path / "shipped-other" / "x"))
    assert not eager_kernels.ours(os.pathsep.join([str(mine), "/theirs"]))
    monkeypatch.setenv(WARM_STORE, str(mine))  # inherited from a parent
    monkeypatch.setenv(eager_kernels.USE, "0")
    assert eager_kernels.use() == 0 and WARM_STORE not in os.environ


def test_a_broken_archive_is_a_note_not_a_crash(tmp_path, no_store, monkeypatch, capsys):
    monkeypatch.setenv(eager_kernels.caches.CACHE, str(tmp_path))
    shipped = artifact_facts.folder(eager_kernels.KIND, eager_kernels.NAME, FACTS["level"])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "facts.json").write_bytes((shipped / "facts.json").read_bytes())
    (broken / "kernels.tar.xz").write_bytes((shipped / "kernels.tar.xz").read_bytes()[:100_000])
    monkeypatch.setattr(eager_kernels.artifact_facts, "folder", lambda kind, name, level: broken)
    assert eager_kernels.unpacked(FACTS) is None
    assert "was not unpacked" in capsys.readouterr().err
    assert not list((tmp_path / "shipped").iterdir())  # no half-unpacked folder left


def test_max_s_line_for_each_family_it_loads_stays_out_of_a_check():
    from checker.maxrun import WithoutStoreLines

    class Sink:
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text
            return len(text)

    sink = Sink()
    stream = WithoutStoreLines(sink)
    print("[eager-warm] loaded binary from the warm store ['binary_cpu.mef']", file=stream)
    print("a check's own line", file=stream)
    assert sink.text == "a check's own line\n"


def test_damaged_files_are_unpacked_again(tmp_path, no_store, monkeypatch, capsys):
    monkeypatch.setenv(eager_kernels.caches.CACHE, str(tmp_path))
    folder = eager_kernels.unpacked(FACTS)
    first = FACTS["files"][0]
    damaged = folder / first["name"]
    damaged.write_bytes(b"not a MEF")
    assert eager_kernels.unpacked(FACTS) == folder and files.sha256(damaged) == first["sha256"]
    assert "damaged" in capsys.readouterr().err


def test_packing_is_the_same_bytes_for_the_same_files(tmp_path):
    made = []
    for name, data in (("b.mef", b"b" * 100), ("a.mef", b"a")):
        (tmp_path / name).write_bytes(data)
        made.append(tmp_path / name)
    first, second = tmp_path / "1.tar.xz", tmp_path / "2.tar.xz"
    files.pack_archive(made, first)
    files.pack_archive(made[::-1], second)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as archive:
        assert archive.getnames() == ["a.mef", "b.mef"]


@pytest.mark.skipif(bool(NOT_HERE), reason=f"not here: {NOT_HERE}")
def test_every_first_check_on_empty_caches_compiles_nothing():
    """The course's checks with the solutions, from empty caches, in one
    process: every kernel they meet is shipped. Fails when MAX's families
    change under the shipped ones (``python -m maintain make --kind
    eager-kernels --again`` writes them again)."""
    with tempfile.TemporaryDirectory(prefix="gpt2-first-check-") as empty:
        done = run_python("-m", "checker", "all", "--solution", "--no-color", env=empty_caches_env(Path(empty)))
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Progress:" in done.stdout, out
    assert COMPILED_NOTE not in out, out
    assert "[eager-warm]" not in out, out  # MAX's line for each family loaded: not the learner's business


ANY_OP = """
import numpy as np
from max.dtype import DType
from max.experimental.tensor import Tensor
from checker import maxrun
with maxrun.interpreter():  # the checker's executor: MAX's eager kernels, nothing else compiled
    x = Tensor.from_dlpack(np.arange(6, dtype=np.float64).reshape(2, 3))
    print(*(x * 2 + 1).cast(DType.int32).max().to_numpy().reshape(-1).tolist(),
          *x.argmax().to_numpy().reshape(-1).tolist())
"""


@pytest.mark.skipif(bool(NOT_HERE), reason=f"not here: {NOT_HERE}")
def test_ops_beyond_the_course_are_shipped_too():
    """float64 arithmetic, a cast to int32, a max and an argmax on empty
    caches, with MAX told it may not compile: every family's whole sweep is
    there. Without them MAX refuses (it would have to compile)."""
    with tempfile.TemporaryDirectory(prefix="gpt2-any-op-") as empty:
        env = empty_caches_env(Path(empty), MAX_EAGER_ALLOW_LAZY_COMPILE="0")
        done = run_python("-c", ANY_OP, env=env)
        refused = run_python("-c", ANY_OP, env={**env, eager_kernels.USE: "0"})
    assert done.returncode == 0 and done.stdout.split() == ["5", "11", "2", "2"], done.stdout + done.stderr
    assert refused.returncode != 0 and "warm-interpreter-cache" in refused.stderr, refused.stderr
