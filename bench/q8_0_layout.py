"""``python -m bench.q8_0_layout``: the Q8_0 kernel on an interleaved weight
layout (bench/q8_0_interleaved, an experiment) against model/kernels' own,
on a whole decode step's matmuls of GPT-2 124M (``bench.kernels``'
STEP_SHAPES), one input row, alternating rounds in one process.

Prints each round's time and GB/s of weights read for both, and whether
their outputs are equal. Not used by the app: it measures whether changing
the layout that ``model/quantize.py`` gives Q8_0 weights is worth it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TILE = 8  # weight rows per tile: R in layout.mojo


def interleave(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 codes [N, K] and scales [N, K / 32] -> the layout of layout.mojo:
    rows padded to whole tiles of 8; per tile and step of 64 weights, the 8
    rows' pieces back to back."""
    n, k = codes.shape
    tiles = -(-n // TILE)
    codes = np.pad(codes, ((0, tiles * TILE - n), (0, 0)))
    scales = np.pad(scales, ((0, tiles * TILE - n), (0, 0)))
    steps = k // 64
    return (np.ascontiguousarray(codes.reshape(tiles, TILE, steps, 64).transpose(0, 2, 1, 3)).reshape(tiles, -1),
            np.ascontiguousarray(scales.reshape(tiles, TILE, steps, 2).transpose(0, 2, 1, 3)).reshape(tiles, -1))


def libraries(folder: Path) -> list[Path]:
    """model/kernels and bench/q8_0_interleaved (which imports it) compiled
    into ``folder``. model/kernels under its own module name, "kernels", for
    the import to resolve (fast_linear.kernel_library's file is named by a
    digest)."""
    from mojo.run import subprocess_run_mojo

    from model.fast_linear import KERNELS

    built = []
    for package, name in ((KERNELS, "kernels"), (HERE / "q8_0_interleaved", "q8_0_interleaved")):
        out = folder / f"{name}.mojoc"
        done = subprocess_run_mojo(["precompile", str(package), "-I", str(KERNELS.parent), "-o", str(out)],
                                   capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"mojo precompile {package} failed:\n{done.stderr}")
        built.append(out)
    return built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.q8_0_layout", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: 3)")
    p.add_argument("--reps", type=int, default=30, help="calls per round; medians (default: 30)")
    args = p.parse_args(argv)
    from max.driver import CPU
    from max.engine import InferenceSession

    from bench.kernels import STEP_SHAPES, graph
    from model.quantize import quantize_q8_0

    rng = np.random.default_rng(0)
    plain = [a for s in STEP_SHAPES for a in quantize_q8_0(rng.standard_normal(s, dtype=np.float32))]
    interleaved = [a for c, d in zip(plain[::2], plain[1::2]) for a in interleave(c, d)]
    nbytes = sum(a.nbytes for a in plain)
    x = rng.standard_normal((1, STEP_SHAPES[0][1]), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        built = libraries(Path(tmp))
        session = InferenceSession(devices=[CPU()], custom_extensions=built)
        runs = {kind: (session.load(graph(kind, 1, STEP_SHAPES, arrays, built)), arrays)
                for kind, arrays in (("q8_0", plain), ("q8_0_interleaved", interleaved))}
        outs = {kind: [t.to_numpy() for t in model.execute(x, *arrays)] for kind, (model, arrays) in runs.items()}
        same = all(np.array_equal(a, b) for a, b in zip(outs["q8_0"], outs["q8_0_interleaved"]))
        print(f"GPT-2 124M's decode-step matmuls in Q8_0 ({nbytes / 1e6:.0f} MB), one input row; "
              f"outputs {'equal' if same else 'DIFFERENT'}")
        for r in range(args.rounds):
            for kind, (model, arrays) in runs.items():
                times = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    model.execute(x, *arrays)
                    times.append(time.perf_counter() - start)
                s = statistics.median(times)
                print(f"round {r}  {kind:<17} {s * 1e3:6.2f} ms  {nbytes / s / 1e9:5.1f} GB/s", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
