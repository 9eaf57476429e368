"""MAX's eager kernels shipped with the project: every eager op family compiled for each shipped CPU level.

Made from empty caches by ``os.cpu_count()`` worker processes, the families
dealt between them, each compiling its families' sweeps for the level in
MAX's virtual mode (for another architecture MAX writes the code without
loading it), one MEF per family, then MAX's manifest for them and one archive.
They depend on MAX's version alone: an archive shipped by the same MAX for the
same target is kept (``--again`` compiles it anew, ~20 min per level on 2
cores). ``first_checks`` times each step's first check on empty caches: none
may compile. Used by the checker: checker/eager_kernels.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from artifacts.facts import ROOT, max_version
from artifacts.mef import MANIFEST
from artifacts.targets import SHIPPED, Target, compile_for
from checker.eager_kernels import KIND, NAME, shipped_facts, unusable_here
from maintain import making

NAMES = (NAME,)
LEVELS = tuple(SHIPPED)
COMPILED_NOTE = "note: this run compiled"  # what the checker prints when a check compiled kernels (checker/maxrun.py)


def compile_families(target: Target, names: list[str], folder: Path) -> int:
    """A worker of ``make``: compile these families' sweeps for ``target`` into ``folder``, one MEF
    each; one JSON line per family on stdout."""
    compile_for(target, compile_only=False)  # before the process's first device
    from max import engine
    from max.driver import CPU

    from model.max_internals import eager_families, eager_sweep

    store = engine.MefStore.for_export(folder)
    session = engine.InferenceSession(devices=[CPU()])
    for family in eager_families():
        if family.name in names:
            module, file = eager_sweep(family)
            session.compile(module).export_mef(store.claim_export_artifact(file))
            print(json.dumps({"family": family.name, "file": file, "ops": len(module.top_level_graph_names())}),
                  flush=True)
    return 0


def make(name: str, target: Target, again: bool = False) -> int:
    """Every eager op family's sweep compiled for ``target`` from empty caches and shipped; kept
    as shipped when the same MAX made it for the same target (unless ``again``)."""
    from max import engine

    from model.device import accelerator_count
    from model.max_internals import eager_families

    if not again and not stale(name, target):
        print(f"{KIND} {name} {target.name}: made by this MAX for this target already, kept (--again compiles them)")
        return 0
    if accelerator_count():  # each family's sweep would hold that GPU's kernels too, under the CPU's name
        print("make: MAX sees a GPU here; make the CPU's kernels on a machine without one", file=sys.stderr)
        return 1
    names = [family.name for family in eager_families()]
    jobs = max(1, min(os.cpu_count() or 1, len(names)))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpt2-eager-kernels-") as work:
        out, empty = Path(work) / "store", Path(work) / "caches"
        out.mkdir()
        workers = [subprocess.Popen([sys.executable, "-m", "maintain.eager_kernels", target.name,
                                     ",".join(names[i::jobs]), str(out)],
                                    env=making.empty_caches_env(empty), cwd=ROOT, stdout=subprocess.PIPE, text=True)
                   for i in range(jobs)]
        families = []
        try:
            for worker in workers:
                lines, _ = worker.communicate()
                if worker.returncode != 0:
                    print(f"a worker failed (exit {worker.returncode}): nothing written", file=sys.stderr)
                    return 1
                families += [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
        finally:
            for worker in workers:  # the others, when one failed: their folder is about to go
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        families.sort(key=lambda f: f["family"])
        if sorted(f["family"] for f in families) != sorted(names):
            print("some families were not compiled: nothing written", file=sys.stderr)
            return 1
        store = engine.MefStore.for_export(out)  # MAX's own manifest: what MAX_EAGER_WARM_STORE reads
        for family in families:
            store.claim_export_artifact(family["file"])
        store.write_manifest()
        made = [*(out / f["file"] for f in families), out / MANIFEST]
        making.ship(KIND, name, target, {"families": families}, made, making.pack_one_archive,
                    f"python -m maintain make --kind {KIND} --target {target.name} --again")
    print(f"{KIND} {name} {target.name}: {sum(f['ops'] for f in families)} kernels in {len(families)} families "
          f"compiled in {time.perf_counter() - start:.0f} s ({jobs} workers)")
    return 0


def stale(name: str, target: Target) -> str:
    """Why the kernels shipped for ``target`` are not what ``make`` would ship ("" when they are)."""
    facts = shipped_facts(target.name)
    if facts is None:
        return "none shipped"
    why = [what for what, ok in (("MAX's version", facts["max"] == max_version()),
                                 ("the target", facts["target"] == target.cpu)) if not ok]
    return f"stale ({', '.join(why)})" if why else ""


def first_checks(steps: list[str]) -> int:
    """Each step's first check on empty caches, each in its own process: 0 when every one passed
    and compiled nothing."""
    from checker import registry

    why = unusable_here(shipped_facts())
    if why:
        print(f"the shipped kernels cannot be used here: {why}")
        return 0 if why != "none are shipped" else 1
    total, bad = 0.0, []
    for number in steps or [step.number for step in registry.STEPS]:
        with tempfile.TemporaryDirectory(prefix="gpt2-first-check-") as empty:
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "checker", number, "--solution", "--no-color"],
                                  env=making.empty_caches_env(Path(empty)), cwd=ROOT, capture_output=True, text=True)
            seconds = time.perf_counter() - start
        total += seconds
        compiled = [line.strip() for line in done.stdout.splitlines() if COMPILED_NOTE in line]
        verdict = "passed" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        print(f"step {number}: first check on empty caches {seconds:.1f} s, {verdict}"
              + (f"; {compiled[0][len('note: '):]}" if compiled else ", nothing compiled"), flush=True)
        if done.returncode != 0 or compiled:
            bad.append(number)
    print(f"{total:.1f} s in all" + (f"; not right: step(s) {', '.join(bad)} (python -m maintain make --kind {KIND} "
                                      "--again writes the kernels again)" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":  # make's worker: python -m maintain.eager_kernels LEVEL FAMILY,... FOLDER
    sys.exit(compile_families(SHIPPED[sys.argv[1]], sys.argv[2].split(","), Path(sys.argv[3])))
