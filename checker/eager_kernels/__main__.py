"""``python -m checker.eager_kernels make`` / ``check`` / ``warm``: the shipped kernels made, measured and used.

See checker/eager_kernels/__init__.py for what is shipped and when it is used.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from checker.eager_kernels import (
    HERE,
    LEVEL,
    MANIFEST,
    archive_for,
    facts_for,
    shipped_facts,
    unusable_here,
    use,
)
from model.max_internals import WARM_STORE
from model.portable import TARGETS, Target
from model.portable import __main__ as portable_make

ROOT = HERE.parents[1]
COMPILED_NOTE = "note: this run compiled"  # what the checker prints when a check compiled kernels (checker/maxrun.py)


def empty_caches_env(folder: Path, **more: str) -> dict[str, str]:
    """model/portable's child environment, with MAX's default eager executor
    and no warm store named (the shipped kernels are the interpreter's)."""
    env = portable_make.empty_caches_env(folder, **more)
    env.pop("MAX_EAGER_EXECUTOR", None)
    return env


def compile_families(target: Target, names: list[str], folder: Path) -> int:
    """A worker of ``make``: compile these families' sweeps for ``target`` into
    ``folder``, one MEF each; one JSON line per family on stdout. Compiled
    only: for another architecture MAX writes the code without loading it."""
    from max import driver

    driver.set_virtual_cpu_target(target.descriptor)  # before the process's first device
    from max import engine
    from max.driver import CPU

    from model.max_internals import eager_families, eager_sweep

    store = engine.MefStore.for_export(folder)
    session = engine.InferenceSession(devices=[CPU()])
    for family in eager_families():
        if family.name in names:
            start = time.perf_counter()
            module, file = eager_sweep(family)
            session.compile(module).export_mef(store.claim_export_artifact(file))
            print(json.dumps({"family": family.name, "file": file, "ops": len(module.top_level_graph_names()),
                              "seconds": round(time.perf_counter() - start, 1)}), flush=True)
    return 0


def pack(files: list[Path], archive: Path) -> None:
    """``files`` into ``archive`` (xz) under their names, byte for byte the
    same for the same files: sorted, no times or owners."""
    with tarfile.open(archive, "w:xz", preset=9) as out:
        for path in sorted(files, key=lambda p: p.name):
            info = tarfile.TarInfo(path.name)
            info.size, info.mode = path.stat().st_size, 0o644
            with open(path, "rb") as data:
                out.addfile(info, data)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make(target: Target) -> int:
    """Every eager op family's sweep compiled for ``target`` from empty caches
    (``os.cpu_count()`` worker processes, the families dealt between them),
    MAX's manifest for them, packed into its archive; their index and figures
    into its facts file."""
    from max import engine

    from model.device import accelerator_count
    from model.max_internals import eager_families

    if accelerator_count():  # each family's sweep would hold that GPU's kernels too, under the CPU's name
        print("make: MAX sees a GPU here; make the CPU's kernels on a machine without one", file=sys.stderr)
        return 1
    names = [family.name for family in eager_families()]
    jobs = max(1, min(os.cpu_count() or 1, len(names)))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpt2-eager-kernels-") as work:
        out, empty = Path(work) / "store", Path(work) / "caches"
        out.mkdir()
        workers = [subprocess.Popen([sys.executable, "-m", "checker.eager_kernels", "make", "--target", target.level,
                                     "--families", ",".join(names[i::jobs]), "--into", str(out)],
                                    env=empty_caches_env(empty), cwd=ROOT, stdout=subprocess.PIPE, text=True)
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
            family.update(bytes=(out / family["file"]).stat().st_size, sha256=sha256(out / family["file"]))
        store.write_manifest()
        pack([*(out / f["file"] for f in families), out / MANIFEST], archive := archive_for(target))
    version = importlib.metadata.version("max")
    facts = {"max": version, "level": target.level, "target": target.descriptor,
             "made_by": f"python -m checker.eager_kernels make --target {target.level}",
             "workers": jobs, "seconds": round(time.perf_counter() - start, 1), "ops": sum(f["ops"] for f in families),
             "mef_bytes": sum(f["bytes"] for f in families), "families": families}
    facts_for(target).write_text(json.dumps(facts, indent=1) + "\n")
    archives = ", ".join(f"{level}.tar.xz" for level in TARGETS)
    portable_make.write_notice(HERE, version, f"Each archive here ({archives}) was made by "
                               "`python -m checker.eager_kernels make --target LEVEL`")
    print(f"{archive.relative_to(ROOT)}: {facts['ops']} kernels in {len(families)} families compiled for "
          f"{target.level} in {facts['seconds']:.0f} s ({jobs} workers), {facts['mef_bytes'] / 1e6:.1f} MB of MEF "
          f"files, {archive.stat().st_size / 1e3:.0f} kB packed")
    return 0


def check(steps: list[str]) -> int:
    """Each step's first check on empty caches, each in its own process: 0
    when every one passed and compiled nothing."""
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
                                  env=empty_caches_env(Path(empty)), cwd=ROOT, capture_output=True, text=True)
            seconds = time.perf_counter() - start
        total += seconds
        compiled = [line.strip() for line in done.stdout.splitlines() if COMPILED_NOTE in line]
        verdict = "passed" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        print(f"step {number}: first check on empty caches {seconds:.1f} s, {verdict}"
              + (f"; {compiled[0][len('note: '):]}" if compiled else ", nothing compiled"), flush=True)
        if done.returncode != 0 or compiled:
            bad.append(number)
    print(f"{total:.1f} s in all" + (f"; not right: step(s) {', '.join(bad)} (python -m checker.eager_kernels make "
                                      "writes the kernels again)" if bad else ""))
    return 1 if bad else 0


def warm(check_only: bool = False) -> int:
    """MAX's eager kernels for this machine: the shipped ones where they serve
    (named for MAX, which then has nothing to compile), else ``max
    warm-interpreter-cache`` compiles them. ``check_only``: say whether the
    machine is ready, compiling nothing (MAX's ``--check``)."""
    why = unusable_here(shipped_facts())
    offered = 0 if why else use()
    if offered:
        print(f"MAX's eager kernels for {LEVEL} CPUs come with this project and serve this one ({offered} op "
              f"families in {os.environ[WARM_STORE]})", flush=True)
    elif not check_only:
        print(f"the project's eager kernels do not serve here ({why or 'they could not be unpacked'}): MAX compiles "
              "its own, once per machine (~20 min on 2 cores) ...", flush=True)
    command = Path(sys.executable).with_name("max")
    return subprocess.run([str(command) if command.exists() else "max", "warm-interpreter-cache",
                           *(["--check"] if check_only else [])]).returncode


def main(argv: list[str] | None = None) -> int:
    import checker.eager_kernels as shipped

    p = argparse.ArgumentParser(prog="python -m checker.eager_kernels", description=shipped.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=shipped.__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, metavar="{make,check,warm}")
    made = sub.add_parser("make", help="compile every eager op family of MAX for a CPU level from empty caches; "
                                       f"write them to {HERE.relative_to(ROOT)}/LEVEL.tar.xz")
    made.add_argument("--target", choices=TARGETS, default=LEVEL,
                      help="the CPU level (default: %(default)s, this machine's or, where none ships, x86's)")
    made.add_argument("--families", help=argparse.SUPPRESS)  # a worker: these families, caches already empty
    made.add_argument("--into", type=Path, help=argparse.SUPPRESS)
    checked = sub.add_parser("check", help="time each step's first check on empty caches (each in its own process); "
                                           "exit 1 when one fails or compiles a kernel")
    checked.add_argument("steps", nargs="*", help="step numbers (default: every step)")
    warmed = sub.add_parser("warm", help="make this machine's eager kernels ready: the shipped ones where they "
                                         "serve, else `max warm-interpreter-cache` (~20 min on 2 cores)")
    warmed.add_argument("--check", action="store_true", help="say whether this machine is ready; compile nothing")
    args = p.parse_args(argv)
    if args.command == "check":
        return check([s.zfill(2) for s in args.steps])
    if args.command == "warm":
        return warm(args.check)
    target = TARGETS[args.target]
    return compile_families(target, args.families.split(","), args.into) if args.families else make(target)


if __name__ == "__main__":
    sys.exit(main())
