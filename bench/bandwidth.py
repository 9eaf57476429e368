"""``python -m bench.bandwidth``: how fast this machine reads memory, with every core.

Decoding one token at batch 1 reads every weight once, so read bandwidth
bounds decode speed: tokens/s <= bandwidth / bytes of weights. This reads a
buffer larger than any cache (default 1 GiB of float32) with one thread per
core, each summing its own slice (numpy releases the GIL while it sums), and
reports the best of several passes. It is a floor on the machine's limit,
not the limit: a tuned kernel (llama.cpp's) may read faster still, and
llama.cpp's own decode speed times its weight bytes is the other floor the
README reports.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def read_bandwidth(gib: float = 1.0, threads: int | None = None, passes: int = 5) -> float:
    """Best GB/s (10^9 bytes) over ``passes`` full reads of ``gib`` GiB."""
    threads = threads or os.cpu_count() or 1
    data = np.ones(int(gib * 2**30) // 4, dtype=np.float32)
    slices = np.array_split(data, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(passes):
            start = time.perf_counter()
            list(pool.map(np.sum, slices))
            best = min(best, time.perf_counter() - start)
    return data.nbytes / best / 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bandwidth", description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=None, help="default: one per core")
    args = p.parse_args(argv)
    threads = args.threads or os.cpu_count()
    for n in sorted({1, threads}):
        print(f"read bandwidth, {n} thread{'s' if n > 1 else ''}: {read_bandwidth(args.gib, n):.1f} GB/s")
    weights = 497_759_232  # GPT-2 124M in float32, the tied head once
    gbs = read_bandwidth(args.gib, threads)
    print(f"=> fp32 GPT-2 124M decode at batch 1 is bounded by ~{gbs * 1e9 / weights:.0f} tokens/s at that rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
