"""MAX's eager kernels, shipped with the project: a first check in seconds, no warm step.

    python -m checker.eager_kernels warm           # make this machine ready: these where they serve, else MAX's warm
    python -m checker.eager_kernels warm --check   # say whether it is ready; compile nothing

The checker runs the learner's modules on MAX's eager interpreter, which
compiles each op's kernel the first time a machine meets it (20-70 s each on 2
cores), or all of them at once with ``max warm-interpreter-cache`` (14-29 min),
and caches them. The project ships every eager op family's kernels (MAX's
whole "sweep", one kernel per op and dtype, as the warm compiles it), compiled
for each shipped CPU level (artifacts/targets.py: x86-64-v3, and Arm's
Neoverse N1, compiled on x86-64), one MEF file per family with MAX's manifest,
in one archive per level in shipped/eager-kernels/max/<level>/ (made by
``python -m maintain make``). They depend on MAX's version only.

``use()``, called before the checks and by the test suite: where they can run
(artifacts/facts.py's ``why_not_here``) and MAX sees no GPU, it unpacks them
once into the project's cache, verified, and names that folder in
``MAX_EAGER_WARM_STORE`` (for this process and the ones it starts): MAX's own
way to take a warm made elsewhere, each family loaded the first time it is
met, nothing compiled (model/max_internals.py says how). Not MAX's disk cache:
its keys include the host CPU's model, so a cache made on one CPU model misses
on every other. Elsewhere nothing changes. ``GPT2_MAX_SHIPPED_KERNELS=0`` turns
this off.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from artifacts import facts as artifact_facts
from artifacts import files
from artifacts.targets import SHIPPED, this_machines
from model import caches
from model.graph_source import none_shipped_here
from model.max_internals import WARM_STORE

KIND = "eager-kernels"
NAME = "max"  # MAX's own kernels, not a model's
TARGET = this_machines() or SHIPPED["x86-64-v3"]  # this machine's level (x86-64-v3's where none is: refused there)
USE = "GPT2_MAX_SHIPPED_KERNELS"  # "0": never use them


def shipped_facts(level: str | None = None) -> dict | None:
    """What the kernels shipped for ``level`` (this machine's) were made with; None when there are none."""
    return artifact_facts.read(artifact_facts.folder(KIND, NAME, level or TARGET.name))


def ours(store: str | None) -> bool:
    """Whether a MAX_EAGER_WARM_STORE value is a folder this module unpacked."""
    return bool(store) and os.pathsep not in store and Path(store).parent == caches.folder("shipped")


def unusable_here(facts: dict | None, cpu_flags: frozenset[str] | None = None, gpus: int | None = None) -> str:
    """Why the shipped kernels cannot serve this process, in words ("" when they can)."""
    if why := none_shipped_here("none are shipped"):
        return why
    if facts is None:
        return "none are shipped"
    if os.environ.get(USE, "1") == "0":
        return f"{USE}=0"
    if os.environ.get("MAX_EAGER_EXECUTOR"):
        return "MAX_EAGER_EXECUTOR is set"  # another executor: the interpreter's kernels may not be what runs
    if os.environ.get(WARM_STORE) and not ours(os.environ[WARM_STORE]):
        return f"{WARM_STORE} names another store"
    why = artifact_facts.why_not_here(facts, cpu_flags)
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
    return len(facts["made_from"]["families"])


def unpacked(facts: dict) -> Path | None:
    """The shipped kernels in the project's cache, unpacked and verified the first time; another
    archive's (another checkout, an older MAX) dropped after a week unused."""
    shipped = artifact_facts.folder(KIND, NAME, facts["level"])
    prefix = f"{KIND}-{facts['level']}-"
    folder = files.unpack(shipped, facts["files"],
                          caches.folder("shipped") / (prefix + files.sha256(shipped / artifact_facts.FACTS)[:16]))
    if folder is not None:
        files.drop_stale(folder, prefix)
    return folder


def warm(check_only: bool = False) -> int:
    """MAX's eager kernels for this machine: the shipped ones where they serve
    (named for MAX, which then has nothing to compile), else ``max
    warm-interpreter-cache`` compiles them. ``check_only``: say whether the
    machine is ready, compiling nothing (MAX's ``--check``)."""
    why = unusable_here(shipped_facts())
    offered = 0 if why else use()
    if offered:
        print(f"MAX's eager kernels for {TARGET.name} CPUs come with this project and serve this one ({offered} op "
              f"families in {os.environ[WARM_STORE]})", flush=True)
    elif not check_only:
        print(f"the project's eager kernels do not serve here ({why or 'they could not be unpacked'}): MAX compiles "
              "its own, once per machine (~20 min on 2 cores) ...", flush=True)
    command = Path(sys.executable).with_name("max")
    return subprocess.run([str(command) if command.exists() else "max", "warm-interpreter-cache",
                           *(["--check"] if check_only else [])]).returncode


if __name__ == "__main__":  # python -m checker.eager_kernels warm [--check] (pixi run warm)
    import argparse

    parser = argparse.ArgumentParser(prog="python -m checker.eager_kernels", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("warm", help="make this machine's eager kernels ready: the shipped ones where they serve, "
                   "else `max warm-interpreter-cache` (~20 min on 2 cores)").add_argument(
        "--check", action="store_true", help="say whether this machine is ready; compile nothing")
    sys.exit(warm(parser.parse_args().check))
