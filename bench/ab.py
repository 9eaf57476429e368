"""``python -m bench.ab OTHER_TREE``: this checkout against another one (a
``git worktree`` of an earlier commit, say) on the same machine, in
alternated rounds: is a change within noise?

Each round runs the bench's worker (``python -m bench --worker DTYPE``, one
fresh process per tree and precision) in both trees, the order swapped every
round, on the bench's random 124M checkpoint, and prints each figure's
medians and every round's ratio (this tree / the other; above 1 is faster
here). Both trees run in this interpreter, so they share MAX and the saved
graphs' folder (each tree's graphs are named by its own sources).

    git worktree add /tmp/before HEAD~1
    python -m bench.ab /tmp/before --dtypes q4_0 float32 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
FIGURES = [  # (label, key, sub-key, higher is better)
    ("prefill 512 (ms)", "prefill_ms", "512", False),
    ("decode b1 (tok/s)", "decode_tok_s", "1", True),
    ("decode b8 (tok/s)", "decode_tok_s", "8", True),
    ("decode at 896+ (tok/s)", "decode_tok_s", "long", True),
]


def worker(tree: Path, folder: Path, dtype: str, reps: int, new_tokens: int) -> dict:
    """The bench's own measurement of one precision, run in ``tree``."""
    from bench.__main__ import measure_ours_in_child

    try:
        return measure_ours_in_child(folder, dtype, "cpu", reps, new_tokens, tree=tree)
    except RuntimeError as exc:
        raise SystemExit(f"{tree} {exc}") from None


def speed(result: dict, key: str, sub: str, higher: bool) -> float:
    """The figure as a speed (higher is faster), so that ratios read the same way for every row."""
    value = result[key][sub]
    return value if higher else 1.0 / value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("other", type=Path, help="the other checkout's root folder")
    p.add_argument("--dtypes", nargs="+", default=["q4_0"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=128)
    args = p.parse_args(argv)
    from bench.common import random_checkpoint

    folder = random_checkpoint("gpt2")
    trees = {"here": HERE, "other": args.other.resolve()}
    for dtype in args.dtypes:
        rounds = []
        for number in range(args.rounds):
            order = ["here", "other"] if number % 2 == 0 else ["other", "here"]
            got = {name: worker(trees[name], folder, dtype, args.reps, args.new_tokens) for name in order}
            rounds.append(got)
            print(f"{dtype} round {number + 1} of {args.rounds} done ({' then '.join(order)})", file=sys.stderr,
                  flush=True)
        print(f"\n{dtype}: {HERE} (here) against {trees['other']} (other), {args.rounds} alternated rounds")
        print(f"{'figure':<24}{'here':>10}{'other':>10}   here / other, each round (above 1: faster here)")
        for label, key, sub, higher in FIGURES:
            if any(sub not in r[name][key] for r in rounds for name in trees):
                continue
            here = statistics.median(r["here"][key][sub] for r in rounds)
            other = statistics.median(r["other"][key][sub] for r in rounds)
            ratios = [speed(r["here"], key, sub, higher) / speed(r["other"], key, sub, higher) for r in rounds]
            print(f"{label:<24}{here:>10.1f}{other:>10.1f}   median {statistics.median(ratios):.2f}: "
                  + " ".join(f"{x:.2f}" for x in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
