"""Every file this project keeps between runs, and where: one folder, one module.

    $GPT2_MAX_CACHE                  default ~/.cache/gpt2-on-max ($XDG_CACHE_HOME honoured)
        graphs/<name>/               compiled graphs as MEFs (model/saved_graphs.py)
        float32-copies/<key>/        a checkpoint's transposed / converted arrays
        quantized/<key>/             a checkpoint's quantized blocks (model/quantize.py)
        kernels/                     model/kernels compiled into a Mojo library (and the
                                     bench's read-loop op: bench/sections.py)
        programs/                    the bench's standalone Mojo programs, built (bench/mojo_program.py)
        bench-<size>-random/         random checkpoints of GPT-2's sizes (random_checkpoint:
                                     the bench, the targets check)
        targets/modular/             MAX's cache for builds for other machines (model/targets.py)
        eager-kernels/<level>-<key>/ MAX's eager kernels shipped for a CPU level, unpacked
                                     (checker/eager_kernels; ~180 MB)
        checks/                      the checker's verdict on each of the learner's steps, by
                                     its files' contents (model/course.py: --impl steps names
                                     a step that fails its check)

Delete the folder to free the space; nothing in it is needed to run, only
to start faster, and nothing in it can stop a run: every entry is written
whole or not at all (``writing``), one that fails to load is set aside and
made again (``set_aside``), and a cache that cannot be written means running
without saving, said once (``without_saving``). ``GPT2_MAX_SAVED_GRAPHS=0`` keeps nothing of the model's (saved graphs,
copies and blocks alike) and makes everything again every run. The kernel
library is always kept: without it MAX precompiles the kernels at every op
call (``layers/custom_op.py``).

What is derived from a checkpoint is found by ``checkpoint_key``, a digest of
its files; ``SavedArrays`` writes such arrays whole or not at all and maps
them back. weights/ knows none of this: ``load_state`` is handed a
``SavedArrays`` (or None) to keep its copies in.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import os
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

SAVED_GRAPHS = "GPT2_MAX_SAVED_GRAPHS"  # "0": keep nothing between runs
CACHE = "GPT2_MAX_CACHE"  # the folder, when not the default


def root() -> Path:
    """This project's cache folder."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpt2-on-max"
    return Path(os.environ.get(CACHE, default))


def enabled() -> bool:
    """Whether graphs, copies and quantized blocks are kept between runs."""
    return os.environ.get(SAVED_GRAPHS, "1") != "0"


def max_cache() -> Path:
    """MAX's own cache folder (compiled kernels and graphs): where MAX 26.7
    puts it by default, or $MODULAR_CACHE_DIR."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "modular"
    return Path(os.environ.get("MODULAR_CACHE_DIR", default))


def random_checkpoint(size: str) -> Path:
    """A random checkpoint of a GPT-2 size (gpt2, gpt2-medium, gpt2-large,
    gpt2-xl), with GPT-2's tokenizer files, written once: the bench's
    weights (speed does not depend on the values) and the targets check's
    shapes."""
    import sys

    from solutions.solution_01 import GPT2Config
    from weights.synthetic import copy_gpt2_tokenizer, write_checkpoint

    place = folder(f"bench-{size}-random")
    if not (place / "model.safetensors").is_file():
        c = GPT2Config.from_name(size)
        sizes = dict(vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd, n_layer=c.n_layer,
                     n_head=c.n_head)
        print(f"writing a random {size} checkpoint to {place} (once)", file=sys.stderr)
        write_checkpoint(place, sizes, seed=0, tokenizer=True)
    elif not (place / "vocab.json").is_file():  # written by an earlier version without them
        copy_gpt2_tokenizer(place)
    return place


def folder(kind: str) -> Path:
    """One kind's folder under ``root()``: graphs, float32-copies, quantized,
    kernels, or one of the bench's (not created here)."""
    return root() / kind


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


def made_once(path: Path, make) -> Path:
    """``path``, made by ``make(staged)`` when it is not there yet (``staged``:
    its final file name, in a staging folder) and published with its digest
    beside it (``<path>.sha256``), so that a damaged file is found, set aside
    and made again. Where the cache cannot be written it is made in a
    temporary folder of this process."""
    if _intact(path):
        return path
    if path.is_file() and not _digest_file(path).is_file():  # made before digests were kept: taken as it is
        with writing(_digest_file(path)) as staged:
            if staged is not None:
                staged.write_text(_sha256(path))
        return path
    if path.is_file():
        set_aside(path, "a compiled file", ValueError("its bytes do not match the digest saved with it"))
    with writing(path) as staged:
        if staged is not None:
            make(staged)
            digest = _digest_file(staged)
            digest.write_text(_sha256(staged))
            publish(digest, _digest_file(path))  # first: a file in place always has its digest
    if _intact(path):
        return path
    if path not in _ELSEWHERE:  # made once a process: MAX refuses a second library of the same kernels
        elsewhere = Path(tempfile.mkdtemp(prefix="gpt2-on-max-")) / path.name
        atexit.register(shutil.rmtree, elsewhere.parent, ignore_errors=True)
        make(elsewhere)
        _ELSEWHERE[path] = elsewhere
    return _ELSEWHERE[path]


_ELSEWHERE: dict[Path, Path] = {}  # what made_once made outside the cache, which could not take it


def _digest_file(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_INTACT: set[tuple] = set()  # (path, size, mtime) found whole by this process: a library is asked for at every op


def _intact(path: Path) -> bool:
    """Whether ``path`` is there and its bytes match the digest published with it."""
    try:
        info = path.stat()
        key = (path, info.st_size, info.st_mtime_ns)
        if key not in _INTACT and _digest_file(path).read_text().strip() == _sha256(path):
            _INTACT.add(key)
        return key in _INTACT
    except OSError:
        return False


def float32_copies(checkpoint: Path) -> SavedArrays | None:
    """Where ``weights.load_state`` keeps the arrays of ``checkpoint`` that are
    not the file's own bytes, or None when nothing is kept."""
    if not enabled():
        return None
    return SavedArrays(folder("float32-copies") / checkpoint_key(checkpoint), checkpoint, one_per_source=True)


def quantized_arrays(checkpoint: Path, *more: str) -> SavedArrays | None:
    """Where a checkpoint's quantized blocks are kept (``more`` names the
    layers, encodings and code), or None when nothing is kept."""
    if not enabled():
        return None
    return SavedArrays(folder("quantized") / checkpoint_key(checkpoint, *more), checkpoint)


SAMPLE = 1 << 16  # bytes read from each end of a file for its key


def checkpoint_key(checkpoint: Path, *more: str) -> str:
    """A digest naming one checkpoint's contents as far as can be told without
    reading them all: each safetensors file's path, size, modification time
    and first and last SAMPLE bytes (a file rewritten within the clock's
    tick, same size, still changes the key), weights/checkpoint.py's code
    (how they are mapped) and ``more``."""
    import weights.checkpoint

    digest = hashlib.sha256(Path(weights.checkpoint.__file__).read_bytes())
    for f in sorted(Path(checkpoint).glob("*.safetensors")):
        info = f.stat()
        digest.update(f"{f.resolve()}|{info.st_size}|{info.st_mtime_ns}".encode())
        with open(f, "rb") as data:
            digest.update(data.read(SAMPLE))
            data.seek(max(info.st_size - SAMPLE, 0))
            digest.update(data.read(SAMPLE))
    digest.update("|".join(more).encode())
    return digest.hexdigest()[:20]


SOURCE = "source.txt"  # beside saved arrays: the checkpoint folder they derive from


class SavedArrays:
    """Arrays saved as .npy files in one folder, written whole or not at all,
    and mapped copy-on-write when read back: writable, so MAX uses them in
    place, as it does the checkpoint's own views (weights/checkpoint.py),
    where it would copy a read-only array.

    ``source``: the checkpoint folder they derive from, recorded beside them.
    Saving prunes the folder's siblings derived from a checkpoint that no
    longer exists (a test's temporary one) and, with ``one_per_source``, those
    of the same checkpoint under an older key (a changed file or code): the
    cache holds what can still be used, not every version ever made."""

    def __init__(self, folder: Path, source: Path | None = None, one_per_source: bool = False) -> None:
        self.folder = Path(folder)
        self.source = Path(source).resolve() if source is not None else None
        self.one_per_source = one_per_source

    def load(self, names) -> dict[str, np.ndarray] | None:
        """The saved arrays of these names, or None if any is missing."""
        try:
            return {name: np.load(self.folder / f"{name}.npy", mmap_mode="c") for name in names}
        except (OSError, ValueError):  # not saved (or cut short: then it is made again)
            return None

    def save(self, arrays) -> None:
        """Save ``arrays`` ({name: array}, or (name, array) pairs, which may be
        made one by one as they are written); if the cache cannot be written,
        they are made again next time."""
        staged = staging(self.folder.parent)
        if staged is None:
            return
        try:
            for name, array in arrays.items() if hasattr(arrays, "items") else arrays:
                np.save(staged / f"{name}.npy", array)
            if self.source is not None:
                (staged / SOURCE).write_text(str(self.source))
                self._prune(keep=staged)
            # Saved only when loading failed: what is there is cut short or
            # corrupt (and would fail every later start), or another process
            # has just saved the same arrays; either way ours replace it.
            shutil.rmtree(self.folder, ignore_errors=True)
            publish(staged, self.folder)  # whole or not at all
        except OSError as exc:
            if exc.errno in UNWRITABLE:
                without_saving(self.folder.parent, exc)
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def _prune(self, keep: Path) -> None:
        for other in self.folder.parent.iterdir():
            try:
                source = Path((other / SOURCE).read_text())
            except OSError:
                continue  # being written, or not one of these
            stale = not source.exists() or (self.one_per_source and source == self.source)
            if other not in (self.folder, keep) and stale:
                shutil.rmtree(other, ignore_errors=True)
