"""``python -m bench.arithmetic``: the cores' float32 multiply-add peak.

The other limit beside ``bench.bandwidth``'s. A prompt of a few tokens does
as many multiply-adds per weight read as it has rows, so from a few rows on
it is bound by arithmetic, not by memory. This builds ``bench/arithmetic.mojo``
(24 independent chains of AVX-512 FMAs per task, nothing read from memory)
with the mojo compiler that ships in the max wheel, runs it on one core and
on every core, and prints 10^9 multiply-adds a second for each, with what a
GPT-2 124M prompt of 16 tokens needs at that peak.

Why: numpy's sgemm is no measure of the cores' peak (it can stop scaling at
the second core where this loop doubles); what a few-row tile uses of the
cores is read against this figure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import mojo_program

SOURCE = Path(__file__).with_name("arithmetic.mojo")
PROMPT_16 = 16 * 84_934_656  # GPT-2 124M's multiply-adds for 16 rows outside the LM head (its 12 blocks' matmuls)


def peak() -> dict[int, float]:
    """Task count -> 10^9 float32 multiply-adds a second (best of three)."""
    out = mojo_program.run(SOURCE)
    return {int(tasks): float(rate) for tasks, rate, _ in (line.split() for line in out.splitlines())}


def report(figures: dict[int, float]) -> str:
    """The printed lines for ``peak()``'s figures: each rate, then the time a
    16-token prompt's multiply-adds take at the best of them."""
    lines = [f"float32 multiply-adds, {tasks} core{'s' if tasks > 1 else ''}: {rate:.1f} G/s"
             for tasks, rate in figures.items()]
    best = max(figures.values())
    lines.append(f"=> GPT-2 124M's 16-token prompt ({PROMPT_16 / 1e9:.2f} G multiply-adds in its blocks) needs at "
                 f"least {PROMPT_16 / best / 1e6:.1f} ms of arithmetic at that peak")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.arithmetic", description=__doc__.split("\n\n")[0])
    p.parse_args(argv)
    print(report(peak()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
