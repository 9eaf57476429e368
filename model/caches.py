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

Delete the folder to free the space; nothing in it is needed to run, only
to start faster. ``GPT2_MAX_SAVED_GRAPHS=0`` keeps nothing of the model's (saved graphs,
copies and blocks alike) and makes everything again every run. The kernel
library is always kept: without it MAX precompiles the kernels at every op
call (``layers/custom_op.py``).

What is derived from a checkpoint is found by ``checkpoint_key``, a digest of
its files; ``SavedArrays`` writes such arrays whole or not at all and maps
them back. weights/ knows none of this: ``load_state`` is handed a
``SavedArrays`` (or None) to keep its copies in.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
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


def made_once(path: Path, make) -> Path:
    """``path``, made by ``make(staging)`` when it is not there yet: made under
    its final file name in a folder of this process, then moved into place,
    so that two processes making it at once both succeed."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging.", dir=path.parent)) / path.name
    try:
        make(staging)
        os.replace(staging, path)
    finally:
        shutil.rmtree(staging.parent, ignore_errors=True)
    return path


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
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=self.folder.parent))
        except OSError:
            return
        try:
            for name, array in arrays.items() if hasattr(arrays, "items") else arrays:
                np.save(staging / f"{name}.npy", array)
            if self.source is not None:
                (staging / SOURCE).write_text(str(self.source))
                self._prune(keep=staging)
            # Saved only when loading failed: what is there is cut short or
            # corrupt (and would fail every later start), or another process
            # has just saved the same arrays; either way ours replace it.
            shutil.rmtree(self.folder, ignore_errors=True)
            os.rename(staging, self.folder)  # whole or not at all
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)

    def _prune(self, keep: Path) -> None:
        for other in self.folder.parent.iterdir():
            try:
                source = Path((other / SOURCE).read_text())
            except OSError:
                continue  # being written, or not one of these
            stale = not source.exists() or (self.one_per_source and source == self.source)
            if other not in (self.folder, keep) and stale:
                shutil.rmtree(other, ignore_errors=True)
