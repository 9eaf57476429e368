"""``python -m bench.kernels``: this project's few-rows matmul kernels
(model/kernels/matmul.mojo) against MAX's own matmul, on GPT-2 124M's 24 MLP
matmuls (12 x [3072, 768] and [768, 3072], 216 MB in fp32) in one compiled
graph, at a few row counts.

Prints per row count: the fp32 kernel and MAX's ``x @ W.T`` (ms, GB/s of
weights read, and the ratio), then the Q8_0 kernel on the same shapes
(int8 codes + float16 scales, 61 MB), and each result's largest difference
from numpy. ``--hot`` uses two weight matrices 12 times each, so the weights
sit in the CPU's cache: a kernel as fast there as out of it is limited by
its instructions, not by memory. This is where model/fast_linear.py's
FEW_ROWS came from.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

SHAPES = [(3072, 768), (768, 3072)] * 12


def graph(kind: str, rows: int, shapes):
    """One graph: 24 matmuls, each fed from the input (x, or the previous
    wide output scaled), every output returned so that none is dropped."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops

    from model.fast_linear import kernel_library

    cpu = DeviceRef.CPU()
    types = [TensorType(DType.float32, [rows, shapes[0][1]], device=cpu)]
    for out_dim, in_dim in shapes:
        if kind == "q8_0":
            types += [TensorType(DType.int8, [out_dim, in_dim], device=cpu),
                      TensorType(DType.float16, [out_dim, in_dim // 32], device=cpu)]
        else:
            types.append(TensorType(DType.float32, [out_dim, in_dim], device=cpu))
    per = 2 if kind == "q8_0" else 1
    with Graph(f"bench_{kind}", input_types=types, custom_extensions=[kernel_library()]) as g:
        x, *w = g.inputs
        h, outs = x, []
        for i, (out_dim, _) in enumerate(shapes):
            out_type = [TensorType(DType.float32, [rows, out_dim], device=cpu)]
            weights = w[per * i:per * i + per]
            if kind == "max":
                y = h @ ops.transpose(weights[0], 0, 1)
            else:
                y = ops.custom(f"few_rows_matmul_{kind}", cpu, [h, *weights], out_type)[0]
            outs.append(y)
            h = y * 0.01 if out_dim == shapes[0][0] else x
        g.output(*outs)
    return g


def reference(x: np.ndarray, dense: list[np.ndarray], shapes) -> list[np.ndarray]:
    h, outs = x, []
    for (out_dim, _), w in zip(shapes, dense):
        y = h @ w.T
        outs.append(y)
        h = y * 0.01 if out_dim == shapes[0][0] else x
    return outs


def timed(model, args, reps: int) -> float:
    model.execute(*args)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        model.execute(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32], help="row counts (default: 1 4 8 16 32)")
    p.add_argument("--reps", type=int, default=20, help="calls per figure; medians (default: 20)")
    p.add_argument("--hot", action="store_true", help="two weight matrices used 12 times each: weights in cache")
    args = p.parse_args(argv)
    from max.driver import CPU
    from max.engine import InferenceSession

    from model.fast_linear import kernel_library
    from model.quantize import dequantize_q8_0, quantize_q8_0

    rng = np.random.default_rng(0)
    distinct = 2 if args.hot else len(SHAPES)
    made = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES[:distinct]]
    dense = [made[i % distinct] for i in range(len(SHAPES))]
    q8 = [quantize_q8_0(w) for w in dense]
    session = InferenceSession(devices=[CPU()], custom_extensions=[kernel_library()])
    weights = {"f32": (dense, sum(w.nbytes for w in dense)), "max": (dense, sum(w.nbytes for w in dense)),
               "q8_0": ([a for pair in q8 for a in pair], sum(c.nbytes + d.nbytes for c, d in q8))}
    q8_dense = [dequantize_q8_0(c, d) for c, d in q8]
    print(f"GPT-2 124M's 24 MLP matmuls{' (weights in cache)' if args.hot else ''}; medians of {args.reps}")
    print(f"{'rows':>4} {'kernel fp32':>22} {'MAX x @ W.T':>22} {'ratio':>6} {'kernel q8_0':>22}  largest rel. diff")
    for rows in args.rows:
        x = rng.standard_normal((rows, SHAPES[0][1]), dtype=np.float32)
        cells, diffs, seconds = [], [], {}
        for kind in ("f32", "max", "q8_0"):
            arrays, nbytes = weights[kind]
            model = session.load(graph(kind, rows, SHAPES))
            got = [t.to_numpy() for t in model.execute(x, *arrays)]
            want = reference(x, q8_dense if kind == "q8_0" else dense, SHAPES)
            diffs.append(max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(got, want)))
            seconds[kind] = timed(model, [x, *arrays], args.reps)
            cells.append(f"{seconds[kind] * 1e3:8.2f} ms {nbytes / seconds[kind] / 1e9:6.1f} GB/s")
        ratio = seconds["max"] / seconds["f32"]
        print(f"{rows:>4} {cells[0]:>22} {cells[1]:>22} {ratio:5.2f}x {cells[2]:>22}  "
              f"{diffs[0]:.1e} / {diffs[1]:.1e} / {diffs[2]:.1e}")
    print("(ratio: MAX's time / the fp32 kernel's; above 1 the kernel wins. q8_0 rounds the activations to 8 bits "
          "per block of 32, as llama.cpp does: its difference from numpy's exact product is ~1e-2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
