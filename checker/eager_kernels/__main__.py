"""``python -m checker.eager_kernels make`` / ``check``: the shipped kernels made, and measured.

See checker/eager_kernels/__init__.py for what is shipped and when the checker uses it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from checker.eager_kernels import ARCHIVE, FACTS, HERE, LEVEL, USE, shipped_facts, unusable_here
from model.portable import TARGET
from model.portable import __main__ as portable_make

ROOT = HERE.parents[1]
COMPILED_NOTE = "note: this run compiled"  # what the checker prints when a check compiled kernels (checker/maxrun.py)


def empty_caches_env(folder: Path, **more: str) -> dict[str, str]:
    """model/portable's child environment, and MAX's default eager executor
    (the shipped kernels are the interpreter's)."""
    env = portable_make.empty_caches_env(folder, **more)
    env.pop("MAX_EAGER_EXECUTOR", None)
    return env


def compile_every_step() -> list[dict]:
    """Every step's checks on its solution, in this process, compiling for the
    level: what each step's first check compiled and took, in order (later
    steps find the kernels earlier ones compiled)."""
    from max import driver

    driver.set_virtual_cpu_target(TARGET)  # before the process's first device
    from checker import maxrun, registry
    from checker.__main__ import check_step

    steps = []
    for step in registry.STEPS:
        since, start = len(maxrun.COMPILED), time.perf_counter()
        passed = check_step(step.number, step.solution, color=False, quiet=True)
        compiled = maxrun.COMPILED[since:]
        steps.append({"step": step.number, "passed": passed, "seconds": round(time.perf_counter() - start, 1),
                      "kernels": len(compiled), "compile_seconds": round(sum(s for _, s in compiled), 1)})
    return steps


def pack(files: list[Path], archive: Path) -> None:
    """``files`` into ``archive`` (xz) under their names, byte for byte the
    same for the same files: sorted, no times or owners."""
    with tarfile.open(archive, "w:xz", preset=9) as out:
        for path in sorted(files, key=lambda p: p.name):
            info = tarfile.TarInfo(path.name)
            info.size, info.mode = path.stat().st_size, 0o644
            with open(path, "rb") as data:
                out.addfile(info, data)


def export_kernels(folder: Path) -> list[dict]:
    """Every eager kernel this process compiled, each as a MEF file in
    ``folder``: their index (family, key, file), in the order of their keys."""
    from model.max_internals import eager_kernels, export_eager_kernel

    index = []
    for family, key, model in sorted(eager_kernels(), key=lambda kernel: kernel[1]):
        file = re.sub(r"[^\w.-]", "_", key) + ".mef"
        export_eager_kernel(model, folder / file)
        index.append({"family": family, "key": key, "file": file})
    return index


def make_here() -> int:
    """The child of ``make``: its caches are empty folders."""
    steps = compile_every_step()
    failed = [s["step"] for s in steps if not s["passed"]]
    if failed:
        print(f"the solutions failed the checks of step(s) {', '.join(failed)}: nothing written", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="gpt2-eager-kernels-") as out:
        kernels = export_kernels(Path(out))
        pack([Path(out) / kernel["file"] for kernel in kernels], ARCHIVE)
        unpacked_bytes = sum((Path(out) / kernel["file"]).stat().st_size for kernel in kernels)
    version = importlib.metadata.version("max")
    facts = {"max": version, "level": LEVEL, "target": TARGET, "made_by": "python -m checker.eager_kernels make",
             "first_checks_in_one_process": steps, "mef_bytes": unpacked_bytes, "kernels": kernels}
    FACTS.write_text(json.dumps(facts, indent=1) + "\n")
    portable_make.write_notice(HERE, version,
                               f"The kernels in {ARCHIVE.name} were made by `python -m checker.eager_kernels make`")
    print(f"{ARCHIVE.relative_to(ROOT)}: {len(kernels)} kernels compiled for {LEVEL} in "
          f"{sum(s['compile_seconds'] for s in steps):.0f} s, {unpacked_bytes / 1e6:.1f} MB of MEF files, "
          f"{ARCHIVE.stat().st_size / 1e3:.0f} kB packed")
    return 0


def make() -> int:
    with tempfile.TemporaryDirectory(prefix="gpt2-eager-kernels-") as empty:
        command = [sys.executable, "-m", "checker.eager_kernels", "make", "--here"]
        env = empty_caches_env(Path(empty), **{USE: "0"})  # compile every kernel: load none of the old ones
        return subprocess.run(command, env=env, cwd=ROOT).returncode


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


def main(argv: list[str] | None = None) -> int:
    import checker.eager_kernels as shipped

    p = argparse.ArgumentParser(prog="python -m checker.eager_kernels", description=shipped.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=shipped.__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, metavar="{make,check}")
    made = sub.add_parser("make", help=f"run every step's checks from empty caches compiling for {LEVEL}; "
                                       f"write the kernels they compiled to {ARCHIVE.relative_to(ROOT)}")
    made.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # the child, caches already empty
    checked = sub.add_parser("check", help="time each step's first check on empty caches (each in its own process); "
                                           "exit 1 when one fails or compiles a kernel")
    checked.add_argument("steps", nargs="*", help="step numbers (default: every step)")
    args = p.parse_args(argv)
    if args.command == "check":
        return check([s.zfill(2) for s in args.steps])
    return make_here() if args.here else make()


if __name__ == "__main__":
    sys.exit(main())
