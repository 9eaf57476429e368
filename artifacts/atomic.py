"""Writing anything whole or not at all: the one way the project writes what it keeps.

Every entry (a file, or a folder) is written in a staging folder beside it,
``.staging.<pid>@<host>.*``, then renamed into place: whole or not there. A
staging folder whose process is gone (killed mid-write) is removed by the next
write in that folder (another machine's, on a shared folder, after a day). A
folder that cannot be written, or a disk all but full, means one line, said
once, and the caller goes on without saving. An entry found damaged is set
aside as ``<entry>.broken`` and made again.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

# Every entry is written in a staging folder beside it, then renamed into place: whole or
# not at all. A staging folder is named after the process writing it, so that one left by
# a process that died (killed mid-compile) is removed by the next write in that folder.
STAGING = ".staging."
BROKEN = ".broken"  # an entry that failed to load, set aside as <entry>.broken (the last one kept to look at)
# A write failing with one of these means this cache cannot hold more: the run goes on without saving.
UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR}
LOW_SPACE = 256 << 20  # bytes: a disk with less free is full to the cache (a saved graph takes tens of MB)
_said_unsaved = False


def staging(beside: Path) -> Path | None:
    """A new empty folder in ``beside`` (made if need be) to write an entry in
    before ``publish``; None when ``beside`` cannot be written or its disk is
    all but full (said once)."""
    try:
        beside.mkdir(parents=True, exist_ok=True)
        drop_stale_staging(beside)
        if shutil.disk_usage(beside).free < LOW_SPACE:
            # Checked first: MAX writes a compiled graph only once its compile is done.
            raise OSError(errno.ENOSPC, f"less than {LOW_SPACE >> 20} MiB free")
        return Path(tempfile.mkdtemp(prefix=f"{STAGING}{os.getpid()}@{socket.gethostname()}.", dir=beside))
    except OSError as exc:
        without_saving(beside, exc)
        return None


def drop_stale_staging(where: Path, day: float = 86400) -> None:
    """The staging folders in ``where`` whose process is gone: on this machine
    when it no longer runs, on another (a shared cache) after a day."""
    for folder in where.glob(STAGING + "*"):
        pid, _, host = folder.name.removeprefix(STAGING).rpartition(".")[0].partition("@")
        try:
            if host == socket.gethostname():
                os.kill(int(pid), 0)
                continue  # (its process still runs)
            if time.time() - folder.stat().st_mtime < day:
                continue
        except ProcessLookupError:
            pass
        except (OSError, ValueError):  # another user's process, or not a name of ours
            continue
        shutil.rmtree(folder, ignore_errors=True)


def publish(staged: Path, final: Path) -> bool:
    """``staged`` (written in a staging folder) renamed to ``final``. False when
    another process published ``final`` first (a folder is not replaced) or
    the cache could not take it (said once); the caller removes its staging folder."""
    try:
        os.rename(staged, final)
        return True
    except OSError as exc:
        if exc.errno in UNWRITABLE:
            without_saving(final.parent, exc)
        return False


@contextmanager
def writing(final: Path):
    """``with writing(final) as staged:`` write an entry (a file, or a folder
    to make) at ``staged``, in a staging folder; when the block ends it
    becomes ``final``, whole or not at all (``saving``). ``staged`` is None
    when the cache cannot be written (said once: the run goes on)."""
    folder = staging(final.parent)
    if folder is None:
        yield None
        return
    with saving(folder, final, folder / final.name):
        yield folder / final.name


@contextmanager
def saving(folder: Path, final: Path, staged: Path | None = None):
    """The block writes ``staged`` (default: the staging ``folder`` itself),
    then it is published as ``final``; a write that fails for want of space
    or permission ends the block, said once, and the run goes on without
    saving. The staging folder is removed whatever happens."""
    try:
        yield
        publish(staged or folder, final)
    except OSError as exc:
        if exc.errno not in UNWRITABLE:
            raise
        without_saving(final.parent, exc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def without_saving(where: Path, exc: OSError) -> None:
    """Say, once per process, that the cache cannot be written and the run goes on without saving."""
    global _said_unsaved
    if not _said_unsaved:
        _said_unsaved = True
        print(f"note: running without saving: {where} cannot be written ({exc.strerror or exc}); "
              f"what this run compiles is made again next time", file=sys.stderr, flush=True)


def set_aside(entry: Path, what: str, exc: BaseException) -> None:
    """A cache entry that failed to load or verify (``exc`` says why) moved
    out of the way, to ``<entry>.broken``, said in one line; the caller
    makes it again."""
    said = str(exc).strip().splitlines()
    why = type(exc).__name__ + (f": {said[0]}" if said else "")
    aside = entry.with_name(entry.name + BROKEN)
    try:
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside)
        aside.unlink(missing_ok=True)
        os.rename(entry, aside)
        done = f"set aside as {aside.name}, made again"
    except OSError as err:
        done = f"made again, not saved ({err.strerror or err})"
    print(f"note: {what} in {entry} is damaged ({why}): {done}", file=sys.stderr, flush=True)
