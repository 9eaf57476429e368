"""Every file this project keeps between runs, and where: one folder, one module.

    $GPT2_MAX_CACHE                  default: the system's user cache folder's gpt2-on-max
                                     (platformdirs: ~/.cache/gpt2-on-max on Linux, $XDG_CACHE_HOME honoured)
        graphs/<name>/               compiled graphs as MEFs (model/saved_graphs.py)
        float32-copies/<key>/        a checkpoint's transposed / converted arrays
        quantized/<key>/             a checkpoint's quantized blocks (model/quantize.py)
        kernels/                     model/kernels compiled into a Mojo library (and the
                                     bench's read-loop op: bench/sections.py)
        programs/                    the bench's standalone Mojo programs, built (bench/mojo_program.py)
        bench-<size>-random/         random checkpoints of GPT-2's sizes (random_checkpoint:
                                     the bench, the targets check)
        targets/modular/             MAX's cache for builds for other machines (maintain/targets.py)
        shipped/<kind>-<name>-<level>-<key>/  a shipped artifact, unpacked (artifacts/files.py's
                                     unpack: MAX's eager kernels ~180 MB, the server's graphs)
        checks/                      the checker's verdict on each of the learner's steps, by
                                     its files' contents (model/course.py: --impl steps names
                                     a step that fails its check)

Delete the folder to free the space; nothing in it is needed to run, only
to start faster, and nothing in it can stop a run: every entry is written
whole or not at all, one that fails to load is set aside and made again, and
a cache that cannot be written means running without saving, said once
(artifacts/atomic.py: ``writing``, ``set_aside``, ``without_saving``).
``GPT2_MAX_SAVED_GRAPHS=0`` keeps nothing of the model's (saved graphs,
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
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import platformdirs

from artifacts.atomic import UNWRITABLE, publish, set_aside, staging, without_saving, writing
from artifacts.files import sha256

SAVED_GRAPHS = "GPT2_MAX_SAVED_GRAPHS"  # "0": keep nothing between runs
CACHE = "GPT2_MAX_CACHE"  # the folder, when not the default


def root() -> Path:
    """This project's cache folder: the system's user cache folder's (platformdirs: ~/.cache with
    $XDG_CACHE_HOME honoured on Linux, ~/Library/Caches on macOS), unless $GPT2_MAX_CACHE names one."""
    return Path(os.environ.get(CACHE) or platformdirs.user_cache_path("gpt2-on-max"))


def enabled() -> bool:
    """Whether graphs, copies and quantized blocks are kept between runs."""
    return os.environ.get(SAVED_GRAPHS, "1") != "0"


def max_cache() -> Path:
    """MAX's own cache folder (compiled kernels and graphs): $MODULAR_CACHE_DIR, else where MAX 26.7
    puts it, the XDG user cache folder on every system (platformdirs' Unix rule, macOS included)."""
    from platformdirs.unix import Unix

    return Path(os.environ.get("MODULAR_CACHE_DIR") or Unix("modular").user_cache_path)


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
                staged.write_text(sha256(path))
        return path
    if path.is_file():
        set_aside(path, "a compiled file", ValueError("its bytes do not match the digest saved with it"))
    with writing(path) as staged:
        if staged is not None:
            make(staged)
            digest = _digest_file(staged)
            digest.write_text(sha256(staged))
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


_INTACT: set[tuple] = set()  # (path, size, mtime) found whole by this process: a library is asked for at every op


def _intact(path: Path) -> bool:
    """Whether ``path`` is there and its bytes match the digest published with it."""
    try:
        info = path.stat()
        key = (path, info.st_size, info.st_mtime_ns)
        if key not in _INTACT and _digest_file(path).read_text().strip() == sha256(path):
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
