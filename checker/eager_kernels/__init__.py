"""MAX's eager kernels for the course's checks, shipped with the project: a first check in seconds.

    python -m checker.eager_kernels make     # compile them for x86-64-v3 from empty caches, write them here
    python -m checker.eager_kernels check    # each step's first check on empty caches: does one compile?

(Those commands: checker/eager_kernels/__main__.py. This file is what the checker asks.)

The checker runs the learner's modules on MAX's eager interpreter, which
compiles each op's kernel the first time a machine meets it (20-70 s each on 2
cores) and caches it. The project ships the kernels that every step's checks
meet with the reference solutions, compiled for x86-64-v3 (the level of the
shipped demo graph, model/portable: AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE),
each as a MEF file, in one xz archive here with its index (``facts.json``).

``use()``, called by ``python -m checker`` before the checks: on a CPU with
every feature of x86-64-v3, with the MAX they were made with, it unpacks the
archive once into the project's cache and loads the kernels into MAX's eager
interpreter, which finds them before it would compile (model/max_internals.py
says how). Loaded, not copied into MAX's own disk cache: those keys include
the host CPU's model, so a cache made on one CPU model misses on every other.
A learner's edit that meets a kernel not shipped compiles it, for this CPU,
as before (and ``warm``'s kernels serve it). ``GPT2_MAX_SHIPPED_KERNELS=0``
turns this off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from model import caches
from model.portable import LEVEL, cannot_run

HERE = Path(__file__).resolve().parent
ARCHIVE = HERE / f"{LEVEL}.tar.xz"
FACTS = HERE / "facts.json"
USE = "GPT2_MAX_SHIPPED_KERNELS"  # "0": never load them


def shipped_facts() -> dict | None:
    """What the shipped kernels were made with, and their index (None when there are none)."""
    try:
        return json.loads(FACTS.read_text())
    except (OSError, ValueError):
        return None


def unusable_here(facts: dict | None, cpu_flags: frozenset[str] | None = None) -> str:
    """Why the shipped kernels cannot serve this process, in words ("" when they can)."""
    if facts is None or not ARCHIVE.is_file():
        return "none are shipped"
    if os.environ.get(USE, "1") == "0":
        return f"{USE}=0"
    if os.environ.get("MAX_EAGER_EXECUTOR"):
        return "MAX_EAGER_EXECUTOR is set"  # another executor: the interpreter's kernels may not be what runs
    return cannot_run(facts["max"], cpu_flags)


@functools.cache
def use() -> int:
    """Load the shipped kernels into MAX's eager interpreter when they can
    serve here (once a process); the number loaded (0 when none). Nothing is
    compiled."""
    facts = shipped_facts()
    folder = None if unusable_here(facts) else unpacked(facts)
    if folder is None:
        return 0
    from model.max_internals import preload_eager_kernels

    try:
        return preload_eager_kernels([(k["family"], folder / k["file"]) for k in facts["kernels"]])
    except Exception as exc:  # a damaged file or another MAX inside: the checks compile as before
        print(f"note: the shipped kernels were not loaded ({type(exc).__name__}: {str(exc)[:120]}); "
              f"removing {folder} (the next run unpacks them again)", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)
        return 0


def unpacked(facts: dict) -> Path | None:
    """The archive's MEF files in the project's cache, unpacked there the first
    time (whole, or not at all); None when the cache cannot take them."""
    digest = hashlib.sha256(ARCHIVE.read_bytes()).hexdigest()[:16]
    folder = caches.folder("eager-kernels") / f"{LEVEL}-{digest}"
    if folder.is_dir():
        return folder
    staging = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        with tarfile.open(ARCHIVE, "r:xz") as archive:
            archive.extractall(staging, filter="data")
        os.rename(staging, folder)
        for old in folder.parent.glob(f"{LEVEL}-*"):  # kernels of an earlier archive
            if old != folder and "." not in old.name:
                shutil.rmtree(old, ignore_errors=True)
    except OSError:  # another process unpacked it first, or the disk is full
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return folder if folder.is_dir() else None
