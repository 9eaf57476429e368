"""Check one step of the curriculum against its reference solution.

    python -m checker 03                  # check steps/step_03.py
    python -m checker 03 --file my.py     # check another file as step 03
    python -m checker 03 --solution       # check the reference solution itself
    python -m checker all                 # every step; report which are done
    python -m checker 13                  # a bonus step (13-16, optional)
    python -m checker 03 --time-limit 60  # each check's time limit, in seconds (0: none)

Exit code 0 only when every check of every requested step passes. Code of
the learner's that ends the program (sys.exit) or runs past the time limit
fails the check it was in.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from checker import registry
from checker.harness import TIME_LIMIT, Outcome, run_checks
from checker.skeleton import ROOT
from tasks import task_command  # the command as the learner runs tasks (pixi or tasks.py)

GREEN, RED, YELLOW, DIM, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[2m", "\033[0m"


def checks_module(step: str):
    """The checks of one step (every step in checker/registry.py has them)."""
    return registry.find(step).checks()


def check_step(step: str, learner_path: Path, color: bool, quiet: bool = False,
               seconds: float | None = TIME_LIMIT) -> bool:
    """Run one step's checks, each within ``seconds``, and print them; True when every check passed."""
    entry = registry.find(step)
    module = entry.checks()
    paint = (lambda code, text: f"{code}{text}{RESET}") if color else (lambda code, text: text)
    print(f"{entry.heading}: {entry.title} ({_shown(learner_path)})")
    from checker import maxrun

    since = len(maxrun.COMPILED)
    if module.USES_MAX:
        from checker import eager_kernels

        eager_kernels.use()  # the kernels shipped for this machine's CPU level, where this CPU runs them
        maxrun.collect_compiles()
    start = time.perf_counter()
    solution_path = entry.solution
    with maxrun.slow_notice(f"step {step}'s checks"):
        outcomes = run_checks(step, module.CHECKS, learner_path, solution_path, seconds=seconds)
    first_failure: Outcome | None = None
    for outcome in outcomes:
        mark = paint(GREEN, "PASS") if outcome.passed else paint(RED, "FAIL")
        if not quiet or not outcome.passed:
            print(f"  {mark}  {outcome.name}  {paint(DIM, f'{outcome.seconds:.2f} s')}")
        if not outcome.passed:
            for line in outcome.message.splitlines():
                print(f"        {line}")
            if first_failure is None:
                first_failure = outcome
                print(f"        {paint(YELLOW, 'hint:')} {outcome.hint}")
    passed = sum(o.passed for o in outcomes)
    elapsed = time.perf_counter() - start
    verdict = "done" if passed == len(outcomes) else "not done yet"
    print(f"{entry.heading}: {passed} of {len(outcomes)} checks passed in {elapsed:.1f} s; {verdict}.")
    note = maxrun.compile_note(since)
    if note:  # only when this run compiled something that cost time: a warm run says nothing
        print(paint(YELLOW, f"  note: {note}"))
    _record(step, learner_path, first_failure is None)
    return first_failure is None


def _record(step: str, path: Path, passed: bool) -> None:
    """Keep the verdict on the learner's own file, the one ``--impl steps`` imports: the app names a step
    that fails its check."""
    from model.course import record_check, steps_folder

    folder = steps_folder()
    if path.resolve() == (folder / f"step_{step}.py").resolve():
        record_check(step, folder, passed)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checker",
        description="Check your steps/step_NN.py against the reference solution. "
        "Prints one line per check (PASS or FAIL, with its time) and a hint for the first failure.",
    )
    parser.add_argument("step", help=f"step number ({registry.numbers()}; 7 works for 07) or 'all'")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--file", type=Path, help="check this file instead of steps/step_NN.py")
    source.add_argument("--solution", action="store_true", help="check the reference solution itself")
    parser.add_argument("--no-color", action="store_true", help="plain text output")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT, metavar="SECONDS",
                        help=f"fail a check that runs longer (default: {TIME_LIMIT}, room for a first check that "
                             "compiles MAX's kernels; 0: no limit)")
    args = parser.parse_args(argv)
    color = sys.stdout.isatty() and not args.no_color
    if not args.time_limit >= 0:
        parser.error(f"--time-limit must be >= 0 seconds, got {args.time_limit}")
    seconds = args.time_limit if 0 < args.time_limit < float("inf") else None

    if args.step == "all":
        if args.file:
            parser.error("--file needs a single step")
        return check_all(color, args.solution, seconds)
    step = args.step.zfill(2)
    if registry.find(step) is None:
        parser.error(f"no step {args.step!r}: choose {registry.numbers()} or 'all'")
    path = _path(step, args.file, args.solution)
    if not path.is_file():
        print(f"error: {path} {'is a folder, not a Python file' if path.is_dir() else 'does not exist'}",
              file=sys.stderr)
        return 2
    result = check_step(step, path, color, seconds=seconds)
    return 0 if result in (True, None) else 1


def _path(step: str, file: Path | None, solution: bool) -> Path:
    if file is not None:
        return file
    entry = registry.find(step)
    return entry.solution if solution else entry.skeleton


def untouched(step: registry.Step) -> bool:
    """True while the learner's file is still the generated skeleton."""
    from checker.skeleton import make_skeleton

    if not step.skeleton.is_file():
        return False
    source = step.solution.read_text()
    return step.skeleton.read_text() == make_skeleton(source, step.number, str(step.solution.relative_to(ROOT)))


def check_all(color: bool, solution: bool, seconds: float | None = TIME_LIMIT) -> int:
    """Every step; the exit code counts the core steps only (bonus steps are optional,
    and one not started yet gets one line, not its failures)."""
    results = {}
    for step in registry.STEPS:
        if step.bonus and not solution and untouched(step):
            print(f"{step.heading}: {step.title}: not started (optional; `{task_command(step.task)}` checks it)")
            results[step.number] = False
            continue
        results[step.number] = check_step(step.number, _path(step.number, None, solution), color, quiet=True,
                                          seconds=seconds)
        print()
    print("Progress:")
    bonus_seen = False
    for step in registry.STEPS:
        if step.bonus and not bonus_seen:
            print("  bonus steps (optional):")
            bonus_seen = True
        state = "done" if results[step.number] else "not done"
        print(f"  {step.number}  {step.title:<42} {state}")
    written = [results[s.number] for s in registry.STEPS if not s.bonus]
    bonus = [results[s.number] for s in registry.STEPS if s.bonus]
    print(f"{sum(written)} of {len(written)} steps done; {sum(bonus)} of {len(bonus)} bonus steps.")
    return 0 if all(written) else 1


if __name__ == "__main__":
    from checker import maxrun

    maxrun.without_gpus()  # the checks run on the CPU: nothing for MAX to compile for a GPU
    sys.exit(main())
