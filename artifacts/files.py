"""An artifact's files: their digests, packed for shipping, and unpacked whole and verified.

A shipped artifact's facts list its files (``facts.FILES``): each one's name,
where it is packed (an xz file of its own, ``<name>.xz``; one tar.xz archive
holding several; or the file itself), its bytes and its sha256. ``unpack``
makes a cache folder of them whole or not at all and checks every byte count
and digest once; a folder found later is checked by its files' sizes (cheap,
at every use), and one that fails is set aside and unpacked again.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import sys
import tarfile
from pathlib import Path

from artifacts import atomic

ARCHIVE = ".tar.xz"  # several files packed in one archive


def sha256(path: Path) -> str:
    """A file's sha256, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def files_digest(paths: list[Path], root: Path, seed: str = "") -> str:
    """A digest of ``seed`` (what else the files are used with: a compiler's version), then of
    files' names (from ``root``; a file outside it as its folder's name and its own) and bytes, in
    the order given."""
    digest = hashlib.sha256(seed.encode())
    for path in paths:
        where = path.relative_to(root) if path.is_relative_to(root) else Path(path.parent.name, path.name)
        digest.update(where.as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def entry(path: Path, packed: str) -> dict:
    """The facts of one file: its name, where it is packed, its bytes and sha256."""
    return {"name": path.name, "packed": packed, "bytes": path.stat().st_size, "sha256": sha256(path)}


def pack_xz(source: Path, out: Path) -> None:
    """``source`` compressed into ``out`` (xz, the strongest preset: the repository keeps it)."""
    with open(source, "rb") as raw, lzma.open(out, "wb", preset=9) as packed:
        shutil.copyfileobj(raw, packed)


def pack_archive(files: list[Path], archive: Path) -> None:
    """``files`` into one tar.xz ``archive`` under their names, byte for byte the same for the same
    files: sorted, no times or owners."""
    with tarfile.open(archive, "w:xz", preset=9) as out:
        for path in sorted(files, key=lambda p: p.name):
            info = tarfile.TarInfo(path.name)
            info.size, info.mode = path.stat().st_size, 0o644
            with open(path, "rb") as data:
                out.addfile(info, data)


def intact(folder: Path, files: list[dict], digests: bool = False) -> bool:
    """Whether ``folder`` holds every one of ``files`` at its size (and, with ``digests``, its sha256)."""
    try:
        return all((folder / f["name"]).stat().st_size == f["bytes"]
                   and (not digests or sha256(folder / f["name"]) == f["sha256"]) for f in files)
    except OSError:
        return False


def unpack(shipped: Path, files: list[dict], folder: Path, texts: dict[str, str] | None = None) -> Path | None:
    """``files`` (packed in ``shipped``) in ``folder``, with ``texts`` written beside them: unpacked
    whole the first time and every byte checked, then found by their sizes. A folder found damaged
    is set aside and unpacked again; None when it cannot be (a packed file missing or cut short;
    a note says why) or the cache cannot be written (said once)."""
    if folder.is_dir():
        if intact(folder, files):
            os.utime(folder)  # (in use: not stale)
            return folder
        atomic.set_aside(folder, "a shipped artifact", ValueError("files missing or of the wrong size"))
    try:
        with atomic.writing(folder) as staged:
            if staged is None:
                return None
            staged.mkdir()
            _unpack_into(shipped, files, staged)
            for name, text in (texts or {}).items():
                (staged / name).write_text(text)
            if not intact(staged, files, digests=True):
                raise ValueError(f"the files unpacked from {shipped} do not match its facts")
    except (tarfile.TarError, lzma.LZMAError, EOFError, ValueError, FileNotFoundError) as exc:
        print(f"note: {shipped} was not unpacked ({type(exc).__name__}: {exc})", file=sys.stderr)
    return folder if intact(folder, files) else None


def _unpack_into(shipped: Path, files: list[dict], out: Path) -> None:
    archives: dict[str, list[str]] = {}
    for f in files:
        if f["packed"].endswith(ARCHIVE):
            archives.setdefault(f["packed"], []).append(f["name"])
        elif f["packed"].endswith(".xz"):
            with lzma.open(shipped / f["packed"]) as source, open(out / f["name"], "wb") as target:
                shutil.copyfileobj(source, target)
        else:
            shutil.copy(shipped / f["packed"], out / f["name"])
    for archive, names in archives.items():
        with tarfile.open(shipped / archive, "r:xz") as packed:
            packed.extractall(out, members=[packed.getmember(name) for name in names], filter="data")


def drop_stale(kept: Path, prefix: str, days: float = 7) -> None:
    """Folders beside ``kept`` named ``prefix``* and unused for ``days`` (another checkout's, an older MAX's)."""
    import time

    for old in kept.parent.glob(prefix + "*"):
        if old != kept and old.is_dir() and time.time() - old.stat().st_mtime > days * 86400:
            shutil.rmtree(old, ignore_errors=True)
