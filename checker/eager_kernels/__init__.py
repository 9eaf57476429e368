"""MAX's eager kernels, shipped with the project: a first check in seconds, no warm step.

    python -m checker.eager_kernels make     # compile them for this machine's level from empty caches, write them here
    python -m checker.eager_kernels make --target neoverse-n1   # for Arm's, from any machine
    python -m checker.eager_kernels check    # each step's first check on empty caches: does one compile?
    python -m checker.eager_kernels warm     # make this machine ready: these where they serve, else MAX's warm

(Those commands: checker/eager_kernels/__main__.py. This file is what the checker asks.)

The checker runs the learner's modules on MAX's eager interpreter, which
compiles each op's kernel the first time a machine meets it (20-70 s each on 2
cores), or all of them at once with ``max warm-interpreter-cache`` (14-29 min),
and caches them. The project ships every eager op family's kernels (MAX's
whole "sweep", one kernel per op and dtype, as the warm compiles it), compiled
for each CPU level the compiled graphs are shipped for (model/portable: x86-64-v3,
and Arm's Neoverse N1, compiled on x86-64), one MEF file per family with MAX's
manifest, in one xz archive per level here (``LEVEL.tar.xz``) with their index
(``LEVEL.json``). They depend on MAX's version only, not on this project's code.

``use()``, called before the checks and by the test suite: on Linux on a CPU
with every feature of this machine's level, with the MAX they were made with
and no GPU in sight, it unpacks that archive once into the project's cache and
names that folder in ``MAX_EAGER_WARM_STORE`` (for this process and the ones
it starts): MAX's own way to take a warm made elsewhere, each family loaded
the first time it is met, nothing compiled (model/max_internals.py says how).
Not MAX's disk cache: its keys include the host CPU's model, so a cache made
on one CPU model misses on every other. Elsewhere nothing changes.
``GPT2_MAX_SHIPPED_KERNELS=0`` turns this off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import lzma
import os
import shutil
import sys
import tarfile
from pathlib import Path

from model import caches
from model.max_internals import WARM_STORE
from model.portable import TARGETS, X86, Target, cannot_run, none_shipped_here, this_machines

HERE = Path(__file__).resolve().parent


def archive_for(target: Target) -> Path:
    return HERE / f"{target.level}.tar.xz"


def facts_for(target: Target) -> Path:
    return HERE / f"{target.level}.json"


# This machine's (x86-64-v3's where none is, refused there saying why): the kernels are compiled
# for the levels the compiled graphs are shipped for (model/portable).
_THIS_MACHINES = this_machines() or X86
LEVEL = _THIS_MACHINES.level
ARCHIVE = archive_for(_THIS_MACHINES)
FACTS = facts_for(_THIS_MACHINES)
USE = "GPT2_MAX_SHIPPED_KERNELS"  # "0": never use them
MANIFEST = "manifest.json"  # MAX's MefStore index, in the archive beside the MEF files


def shipped_facts(target: Target | None = None) -> dict | None:
    """What the kernels shipped for ``target`` (this machine's) were made with, and their index
    (None when there are none)."""
    try:
        return json.loads((FACTS if target is None else facts_for(target)).read_text())
    except (OSError, ValueError):
        return None


def ours(store: str | None) -> bool:
    """Whether a MAX_EAGER_WARM_STORE value is a folder this module unpacked."""
    return bool(store) and os.pathsep not in store and Path(store).parent == caches.folder("eager-kernels")


def unusable_here(facts: dict | None, cpu_flags: frozenset[str] | None = None, gpus: int | None = None) -> str:
    """Why the shipped kernels cannot serve this process, in words ("" when they can)."""
    if facts is None or facts.get("level") not in TARGETS or not archive_for(TARGETS[facts["level"]]).is_file():
        return "none are shipped"
    if why := none_shipped_here("none are shipped"):
        return why
    if os.environ.get(USE, "1") == "0":
        return f"{USE}=0"
    if os.environ.get("MAX_EAGER_EXECUTOR"):
        return "MAX_EAGER_EXECUTOR is set"  # another executor: the interpreter's kernels may not be what runs
    if os.environ.get(WARM_STORE) and not ours(os.environ[WARM_STORE]):
        return f"{WARM_STORE} names another store"
    why = cannot_run(facts["max"], cpu_flags, TARGETS[facts["level"]])
    if why:
        return why
    if gpus is None:
        from model.device import accelerator_count

        gpus = accelerator_count()
    # MAX's eager families sweep every device in sight: with a GPU they would want its kernels too.
    return f"MAX sees {gpus} GPU(s) (these kernels are the CPU's)" if gpus else ""


@functools.cache
def use() -> int:
    """Name the shipped kernels in MAX_EAGER_WARM_STORE when they can serve
    here (once a process); the number of op families offered (0 when none).
    Nothing is compiled or loaded yet: MAX loads a family from the folder the
    first time it meets it. Called before the process's first eager op,
    because MAX reads the variable once (``gc_compile.warm_store`` is cached).
    Where they cannot serve, a name of ours inherited from a parent is
    dropped, so that ``GPT2_MAX_SHIPPED_KERNELS=0`` holds for children too."""
    facts = shipped_facts()
    folder = None if unusable_here(facts) else unpacked(facts)
    if folder is None:
        if ours(os.environ.get(WARM_STORE)):
            del os.environ[WARM_STORE]
        return 0
    os.environ[WARM_STORE] = str(folder)
    return len(facts["families"])


def intact(folder: Path, facts: dict, digests: bool = False) -> bool:
    """Whether ``folder`` holds every file of the index at its size (and,
    with ``digests``, its sha256: once, when unpacked)."""
    try:
        return (folder / MANIFEST).is_file() and all(
            (folder / f["file"]).stat().st_size == f["bytes"]
            and (not digests or hashlib.sha256((folder / f["file"]).read_bytes()).hexdigest() == f["sha256"])
            for f in facts["families"])
    except OSError:
        return False


STALE_DAYS = 7  # another archive's kernels (another checkout, an older MAX) are dropped after this long unused


def unpacked(facts: dict) -> Path | None:
    """The archive's files in the project's cache, unpacked there the first
    time (whole, or not at all: model/caches.py's ``writing``) and checked
    against the index; None when they cannot be (a note says why). Files
    found damaged are set aside and unpacked again. Each use marks the
    folder, so another checkout's, in use, is not dropped."""
    level = facts["level"]
    archive = archive_for(TARGETS[level])
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    folder = caches.folder("eager-kernels") / f"{level}-{digest}"
    if folder.is_dir():
        if intact(folder, facts):
            os.utime(folder)
            return folder
        caches.set_aside(folder, "MAX's shipped kernels", ValueError("files missing or of the wrong size"))
    try:
        with caches.writing(folder) as staged:
            if staged is not None:
                with tarfile.open(archive, "r:xz") as packed:
                    packed.extractall(staged, filter="data")
                if not intact(staged, facts, digests=True):
                    raise ValueError(f"{archive.name} does not match {level}.json")
        drop_stale(folder, level)
    except OSError:  # another process unpacked it first
        pass
    except (tarfile.TarError, lzma.LZMAError, EOFError, ValueError) as exc:  # the archive is not whole
        print(f"note: the shipped kernels were not unpacked ({exc}); MAX compiles what it meets", file=sys.stderr)
    return folder if folder.is_dir() and intact(folder, facts) else None


def drop_stale(kept: Path, level: str) -> None:
    """The same level's other archives' folders beside ``kept`` unused for STALE_DAYS."""
    import time

    now = time.time()
    for old in kept.parent.glob(f"{level}-*"):
        if old != kept and now - old.stat().st_mtime > STALE_DAYS * 86400:
            shutil.rmtree(old, ignore_errors=True)
