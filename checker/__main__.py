"""Check one step of the curriculum against its reference solution.

    python -m checker 03                  # check steps/step_03.py
    python -m checker 03 --file my.py     # check another file as step 03
    python -m checker 03 --solution       # check the reference solution itself
    python -m checker all                 # every step; report which are done
    python -m checker 13                  # a bonus step (13-16, optional)

Exit code 0 only when every check of every requested step passes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from checker.harness import Outcome, run_checks
from checker.skeleton import ROOT

# Every step of the course; a step without a checks module is not written yet.
STEP_TITLES = {
    "01": "the GPT-2 config",
    "02": "the causal mask",
    "03": "layer normalization",
    "04": "the MLP (GPT2MLP)",
    "05": "token embeddings",
    "06": "position embeddings",
    "07": "multi-head attention",
    "08": "residual connections and pre-layer-norm",
    "09": "the transformer block",
    "10": "the stacked model",
    "11": "the language-model head",
    "12": "text generation",
    # Bonus steps (optional): attention as other courses write it.
    "13": "multi-head attention in numpy (bonus)",
    "14": "the post-LN attention block (bonus)",
    "15": "attention weights (bonus)",
    "16": "rotary causal attention (bonus)",
}
BONUS = ("13", "14", "15", "16")

GREEN, RED, YELLOW, DIM, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[2m", "\033[0m"


def checks_module(step: str):
    """The checks of one step (every step in STEP_TITLES has them)."""
    return importlib.import_module(f"checker.checks.step_{step}")


def check_step(step: str, learner_path: Path, color: bool, quiet: bool = False) -> bool:
    """Run one step's checks and print them; True when every check passed."""
    module = checks_module(step)
    paint = (lambda code, text: f"{code}{text}{RESET}") if color else (lambda code, text: text)
    print(f"Step {step}: {module.TITLE} ({_shown(learner_path)})")
    from checker import maxrun

    since = len(maxrun.COMPILED)
    if module.USES_MAX:
        maxrun.collect_compiles()
    start = time.perf_counter()
    solution_path = ROOT / "solutions" / f"solution_{step}.py"
    with maxrun.slow_notice(f"step {step}'s checks"):
        outcomes = run_checks(step, module.CHECKS, learner_path, solution_path)
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
    print(f"Step {step}: {passed} of {len(outcomes)} checks passed in {elapsed:.1f} s; {verdict}.")
    note = maxrun.compile_note(since)
    if note:  # only when this run compiled something that cost time: a warm run says nothing
        print(paint(YELLOW, f"  note: {note}"))
    return first_failure is None


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
    parser.add_argument("step", help="step number (01-12, bonus 13-16; 1-16 also works) or 'all'")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--file", type=Path, help="check this file instead of steps/step_NN.py")
    source.add_argument("--solution", action="store_true", help="check the reference solution itself")
    parser.add_argument("--no-color", action="store_true", help="plain text output")
    args = parser.parse_args(argv)
    color = sys.stdout.isatty() and not args.no_color

    if args.step == "all":
        if args.file:
            parser.error("--file needs a single step")
        return check_all(color, args.solution)
    step = args.step.zfill(2)
    if step not in STEP_TITLES:
        parser.error(f"no step {args.step!r}: choose 01-{max(STEP_TITLES)} or 'all'")
    path = _path(step, args.file, args.solution)
    if not path.exists():
        print(f"error: {path} does not exist", file=sys.stderr)
        return 2
    result = check_step(step, path, color)
    return 0 if result in (True, None) else 1


def _path(step: str, file: Path | None, solution: bool) -> Path:
    if file is not None:
        return file
    if solution:
        return ROOT / "solutions" / f"solution_{step}.py"
    return ROOT / "steps" / f"step_{step}.py"


def check_all(color: bool, solution: bool) -> int:
    """Every step; the exit code counts the core steps only (bonus steps are optional)."""
    results = {}
    for step in STEP_TITLES:
        results[step] = check_step(step, _path(step, None, solution), color, quiet=True)
        print()
    print("Progress:")
    for step, result in results.items():
        if step == BONUS[0]:
            print("  bonus steps (optional):")
        state = "done" if result else "not done"
        print(f"  {step}  {STEP_TITLES[step]:<42} {state}")
    written = [r for step, r in results.items() if step not in BONUS]
    bonus = [r for step, r in results.items() if step in BONUS]
    print(f"{sum(written)} of {len(written)} steps done; {sum(bonus)} of {len(bonus)} bonus steps.")
    return 0 if all(written) else 1


if __name__ == "__main__":
    sys.exit(main())
