"""Generate the learner skeletons in ``steps/`` from the solutions (nbgrader style).

The solution is the single source. In ``solutions/solution_NN.py`` every part
the learner writes sits between two marker comments::

        # BEGIN SOLUTION
        return x @ w
        # END SOLUTION

In ``steps/step_NN.py`` that region becomes a placeholder at the marker's
indentation: ``raise NotImplementedError("TODO(step NN) ...")`` by default, or,
when the region has a ``# SKELETON`` part, those lines with one ``# `` removed::

        # BEGIN SOLUTION
        vocab_size: int = 50257
        # SKELETON
        # vocab_size: int = ...  # TODO: tokens in the vocabulary
        # END SOLUTION

Imports of other solutions (``solutions.solution_07``) become imports of the
learner's own files (``steps.step_07``), so a learner's step 09 is built from
the learner's step 07.

    python -m checker.skeleton           # rewrite steps/ from solutions/
    python -m checker.skeleton --check   # exit 1 if steps/ differs (CI)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
STEPS = ROOT / "steps"

_BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION\s*$")
_SKELETON = re.compile(r"^\s*# SKELETON\s*$")
_END = re.compile(r"^\s*# END SOLUTION\s*$")
_SOLUTION_IMPORT = re.compile(r"\bsolutions\.solution_(\d\d\w*)")

TODO_MARK = "TODO(step"


class SkeletonError(ValueError):
    """A solution file whose markers do not pair up."""


def step_id(solution: Path) -> str:
    """``solutions/solution_07.py`` -> ``07``."""
    return solution.stem.removeprefix("solution_")


def skeleton_path(solution: Path) -> Path:
    return STEPS / f"step_{step_id(solution)}.py"


def make_skeleton(source: str, step: str, filename: str = "<solution>") -> str:
    """The learner's file for one solution's source text."""
    out: list[str] = []
    region: str | None = None  # None outside; "code" or "skeleton" inside
    indent = ""
    skeleton_lines: list[str] = []
    begin_line = 0
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        begin = _BEGIN.match(line)
        if region is None:
            if begin:
                region, indent, skeleton_lines, begin_line = "code", begin["indent"], [], number
            elif _SKELETON.match(line) or _END.match(line):
                raise SkeletonError(f"{filename}:{number}: marker outside a solution region")
            else:
                out.append(_SOLUTION_IMPORT.sub(r"steps.step_\1", line))
            continue
        if begin:
            raise SkeletonError(f"{filename}:{number}: nested BEGIN SOLUTION (open since line {begin_line})")
        if _SKELETON.match(line):
            region = "skeleton"
        elif _END.match(line):
            if skeleton_lines:
                out.extend(skeleton_lines)
            else:
                out.append(
                    f'{indent}raise NotImplementedError("{TODO_MARK} {step}): '
                    f'replace this line with your code")\n'
                )
            region = None
        elif region == "skeleton":
            skeleton_lines.append(_uncomment(line, indent, filename, number))
    if region is not None:
        raise SkeletonError(f"{filename}:{begin_line}: BEGIN SOLUTION without END SOLUTION")
    return "".join(out)


def _uncomment(line: str, indent: str, filename: str, number: int) -> str:
    """``    # code`` -> ``    code``: the skeleton part is written as comments."""
    body = line.rstrip("\n")
    if body.strip() == "#":
        return "\n"
    prefix = indent + "# "
    if not body.startswith(prefix):
        raise SkeletonError(
            f"{filename}:{number}: a SKELETON line must start with {prefix!r} (marker indentation + '# ')"
        )
    return indent + body[len(prefix):] + "\n"


def solutions() -> list[Path]:
    return sorted(SOLUTIONS.glob("solution_*.py"))


def generated() -> dict[Path, str]:
    """Every skeleton path with the text it must hold."""
    return {
        skeleton_path(s): make_skeleton(s.read_text(), step_id(s), str(s.relative_to(ROOT)))
        for s in solutions()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checker.skeleton",
        description="Generate steps/step_NN.py from solutions/solution_NN.py.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any skeleton differs"
    )
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check and stale:
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)} (run: python -m checker.skeleton)")
        return 1
    if not stale:
        print("all skeletons up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
