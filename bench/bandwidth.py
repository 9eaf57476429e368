"""``python -m bench.bandwidth``: how fast this machine reads memory, with every core.

Decoding one token at batch 1 reads every weight once, so read bandwidth
bounds decode speed: tokens/s <= bandwidth / bytes of weights. This reads a
buffer larger than any cache (default 1 GiB of float32) two ways and
reports the best of several passes of each:

- a compiled MAX graph that sums the buffer's rows: MAX's vectorized
  reduction, the rows spread by its runtime over every core;
- numpy, one thread per core, each summing its own slice (numpy releases
  the GIL while it sums).

Why both: numpy's float32 sum can be bound by its own arithmetic (pairwise
summation), not by memory, and read well below what MAX's reduction and the
matmul kernels read on the same cores, so numpy alone would put the wall too
low. Both are floors on the
machine's limit, not the limit; llama.cpp's own decode speed times its
weight bytes is the other floor docs/benchmarks.md reports.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROW = 4096  # floats per row of the MAX graph's buffer (rows are its symbolic dimension)


def read_bandwidth(gib: float = 1.0, threads: int | None = None, passes: int = 5) -> float:
    """numpy: best GB/s (10^9 bytes) over ``passes`` full reads of ``gib`` GiB."""
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


def max_read_bandwidth(gib: float = 1.0, passes: int = 5, device: str = "cpu") -> float:
    """A compiled MAX reduction: best GB/s over ``passes`` reads of ``gib``
    GiB (the graph compiles once, and MAX caches it), on the CPU or the GPU
    (``device="gpu"``: the buffer in the card's memory, each pass timed until
    the card is done)."""
    from max.driver import CPU, Accelerator, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    where = Accelerator() if device == "gpu" else CPU()
    types = [TensorType(DType.float32, ["rows", ROW], device=DeviceRef.from_device(where))]
    with Graph("read_bandwidth", input_types=types) as g:
        g.output(ops.sum(g.inputs[0], axis=-1))
    model = InferenceSession(devices=[where]).load(g)
    data = Buffer.from_numpy(np.ones((max(1, int(gib * 2**30) // 4 // ROW), ROW), np.float32)).to(where)
    model.execute(data)
    where.synchronize()
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        model.execute(data)
        where.synchronize()
        best = min(best, time.perf_counter() - start)
    return data.num_elements * 4 / best / 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bandwidth", description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="size of the buffer read (default: 1 GiB)")
    p.add_argument("--threads", type=int, default=None, help="numpy's threads (default: one per core)")
    args = p.parse_args(argv)
    threads = args.threads or os.cpu_count()
    figures = {}
    for n in sorted({1, threads}):
        figures[f"numpy sum, {n} thread{'s' if n > 1 else ''}"] = read_bandwidth(args.gib, n)
    figures["a compiled MAX reduction, every core"] = max_read_bandwidth(args.gib)
    for what, gbs in figures.items():
        print(f"read bandwidth, {what}: {gbs:.1f} GB/s")
    weights = 497_759_232  # GPT-2 124M in float32, the tied head once
    best = max(figures.values())
    print(f"=> fp32 GPT-2 124M decode at batch 1 is bounded by ~{best * 1e9 / weights:.0f} tokens/s at the best "
          f"of these ({best:.1f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
