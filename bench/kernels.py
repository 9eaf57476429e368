"""``python -m bench.kernels``: this project's few-rows matmul kernels
(model/kernels/matmul.mojo) against MAX's own matmul, on GPT-2 124M's 24 MLP
matmuls (12 x [3072, 768] and [768, 3072], 216 MB in fp32) in one compiled
graph, at a few row counts; ``--step``: all of a decode step's matmuls
instead (12 x c_attn, attn c_proj, c_fc, mlp c_proj, and the LM head:
481 MB in fp32), to set against ``bench.profile_decode``'s whole step.

Prints per row count: the fp32 kernel and MAX's ``x @ W.T`` (ms, GB/s of
weights read, and the ratio), then the Q8_0 kernel on the same shapes
(int8 codes + float16 scales, as uint16 bits, in 8-row tiles, 61 MB), the Q4_0 op
(model/kernels/q4_0.mojo) and MAX's own Q4_0 kernel (``vroom_q4_0_matmul``,
what F.qmatmul runs, here without its repack op) on the same packed blocks
(32 MB) with their ratio, and each result's largest difference from numpy.
``--hot`` uses two weight matrices 12 times each, so the weights
sit in the CPU's cache: a kernel as fast there as out of it is limited by
its instructions, not by memory. ``--chain`` feeds each matmul from the one
before, as in the model, where independent ones may overlap. ``--epilogue``
adds a bias to every product and gelu to c_fc's, as in the model, where MAX
fuses them into the op: how the op stores its results then counts (stored
one by one, the layers' attn c_proj, c_fc and mlp c_proj at 12 rows took
2.5 ms longer with them than without). This, with the whole model's prompt, is where
model/layers/few_rows.py's FEW_ROWS came from. (Above FEW_ROWS rows the fp32 op hands the product to
MAX's own matmul from inside itself, so there the two columns time the same
kernel.)

``--paths P1 P2 ...`` times this project's kernels on each kernel path
(model/cpu.py) instead, the paths alternated in one process: which path a
CPU runs fastest, per row count (model/cpu.py's ONE_ROW comes from it).
``--tiny`` times 48 matmuls of [32, 64]: each op's fixed cost.

``--against REV`` also loads model/kernels as of git revision REV (its ops
renamed, compiled as a second library) and times both versions' kernels in
the same process, alternated over ``--rounds`` (default 5 then): this
machine's speed drifts more between minutes than most kernel changes move
it, so two versions are only compared side by side.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent  # the repository (git reads older kernels from it)

SHAPES = [(3072, 768), (768, 3072)] * 12
STEP_SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072)] * 12 + [(50257, 768)]
# --tiny: as many ops as a decode step has matmuls, each too small for its
# arithmetic or its reads to count: what is left is each op's fixed cost
# (its launch, waking the cores, rounding the input).
TINY_SHAPES = [(32, 64)] * 48


def chained(x, outputs: list, in_dim: int, chain: bool = False):
    """The next matmul's input: the previous output, scaled, when its width
    is ``in_dim`` and it is not x's (c_fc feeds mlp c_proj), else x. With
    ``chain``, always the previous output (its first ``in_dim`` columns), so
    each matmul waits for the one before, as in the model."""
    if outputs and (chain or outputs[-1].shape[-1] == in_dim != x.shape[-1]):
        return outputs[-1][:, :in_dim] * 0.01
    return x


def gelu(y: np.ndarray) -> np.ndarray:
    """GPT-2's gelu (the tanh form), as ``ops.gelu(approximate="tanh")``."""
    return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))


def op_parameters(kind: str, path: str = "auto", then_takes: frozenset[str] = frozenset()) -> dict | None:
    """The compile-time parameters a ``few_rows_matmul_<kind>`` op is called
    with: its kernel paths (model/cpu.py's op_paths), and q4_0's band and prefetch; for an --against revision's op
    (``kind`` ending in THEN) those of them it declares (``then_takes``)."""
    from model import cpu as cpu_paths

    parameters = cpu_paths.op_parameters(kind.removesuffix(THEN), path)
    if kind.endswith(THEN):
        parameters = {name: value for name, value in parameters.items() if name in then_takes}
    return parameters or None


def graph(kind: str, rows: int, shapes, weights: list[np.ndarray] | None = None, libraries=None, chain: bool = False,
          epilogue: bool = False, path: str = "auto", then_takes: frozenset[str] = frozenset()):
    """One graph of matmuls, each fed from the input (x, or the previous
    output scaled: ``chained``), every output returned so that none is
    dropped. ``kind``: "max" (``x @ W.T``) or the suffix of a
    ``few_rows_matmul_*`` op, whose weight arrays (one, or two for Q8_0
    codes and scales) are typed from ``weights`` when given; ``libraries``:
    the custom-op libraries (default: model/kernels'). ``epilogue``: each
    product + a bias (one more input per matmul, after the weights), then
    gelu where the matmul widens 4x (c_fc), as in the model, where MAX fuses
    both into the matmul's op. ``path``: this tree's kernel path
    (model/cpu.py); a --against revision's ops are called as they were,
    with those of this tree's parameters that they declare (``then_takes``:
    ``takes``)."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops

    from model.layers.custom_op import kernel_library
    from model.quantize import Q8_0_TILE, padded_rows

    parameters = op_parameters(kind, path, then_takes)
    cpu = DeviceRef.CPU()
    per = 2 if kind.startswith("q8_0") else 1
    if weights is None:
        weights = []
        for out_dim, in_dim in shapes:
            tiles = -(-out_dim // Q8_0_TILE)  # Q8_0 in model/quantize.py's interleaved tiles
            if kind.startswith("q4_0"):  # Q4_0 blocks in MAX's packed layout, rows padded to 32
                weights.append(np.empty((padded_rows(out_dim), in_dim // 32 * 18), np.uint8))
            elif per == 2:
                weights += [np.empty((tiles, in_dim * Q8_0_TILE), np.int8),
                            np.empty((tiles, in_dim * Q8_0_TILE // 32), np.uint16)]  # float16 bits (interleave_q8_0)
            else:
                weights.append(np.empty((out_dim, in_dim), np.float32))
    types = [TensorType(DType.float32, [rows, shapes[0][1]], device=cpu)]
    types += [TensorType(DType.from_numpy(a.dtype), list(a.shape), device=cpu) for a in weights]
    if epilogue:
        types += [TensorType(DType.float32, [out_dim], device=cpu) for out_dim, _ in shapes]
    name = f"bench_{kind}{'_chain' if chain else ''}{'_epilogue' if epilogue else ''}"
    with Graph(name, input_types=types, custom_extensions=libraries or [kernel_library()]) as g:
        x, *w = g.inputs
        w, biases = w[:len(weights)], w[len(weights):]
        outs = []
        for i, (out_dim, in_dim) in enumerate(shapes):
            h = chained(x, outs, in_dim, chain)
            out_type = [TensorType(DType.float32, [rows, out_dim], device=cpu)]
            these = w[per * i:per * i + per]
            if kind == "max":
                outs.append(h @ ops.transpose(these[0], 0, 1))
            elif kind == "q4_0_max":  # MAX's own Q4_0 kernel (F.qmatmul's, without its repack op) on the same blocks
                padded = [TensorType(DType.float32, [rows, padded_rows(out_dim)], device=cpu)]
                outs.append(ops.custom("vroom_q4_0_matmul", cpu, [h, *these], padded)[0][:, :out_dim])
            else:
                outs.append(ops.custom(f"few_rows_matmul_{kind}", cpu, [h, *these], out_type, parameters=parameters)[0])
            if epilogue:
                outs[-1] = outs[-1] + biases[i]
                if out_dim == 4 * in_dim:
                    outs[-1] = ops.gelu(outs[-1], approximate="tanh")
        g.output(*outs)
    return g


def reference(x: np.ndarray, dense: list[np.ndarray], shapes, chain: bool = False,
              biases: list[np.ndarray] | None = None) -> list[np.ndarray]:
    outs: list[np.ndarray] = []
    for i, ((out_dim, in_dim), w) in enumerate(zip(shapes, dense)):
        outs.append(chained(x, outs, in_dim, chain) @ w.T)
        if biases is not None:
            outs[-1] = outs[-1] + biases[i]
            if out_dim == 4 * in_dim:
                outs[-1] = gelu(outs[-1])
    return outs


def timed(model, args, reps: int, warm_up_s: float = 0.5) -> float:
    # Calls for warm_up_s first: a fast graph's first ~20 calls after loading
    # ran up to 2x slower here (a median of 20 cold calls doubled q8_0's time).
    start = time.perf_counter()
    while time.perf_counter() - start < warm_up_s:
        model.execute(*args)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        model.execute(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


THEN = "_then"  # the suffix of --against's ops: few_rows_matmul_f32_then, few_rows_matmul_q8_0_then, ...


def renamed(source: str) -> str:
    """A kernel source with every registered op and every struct renamed
    (THEN, ``Then``): a second library that loads beside this tree's."""
    source = re.sub(r'(@extensibility\.register\("\w+)"', rf'\1{THEN}"', source)
    return re.sub(r"^struct (\w+)", r"struct \1Then", source, flags=re.M)


def library_at(rev: str) -> Path:
    """model/kernels as of git revision ``rev``, every op and struct renamed
    with THEN (so that both versions load in one session), compiled."""
    from model import caches
    from model.layers.custom_op import KERNELS, precompile

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout

    sha = git("rev-parse", rev).strip()
    folder = KERNELS.relative_to(ROOT).as_posix()
    # Named by MAX's version too, as kernel_library's are (a library compiled by another MAX does
    # not load), without dots: the compiler takes the module's name from the file's.
    max_version = importlib.metadata.version("max").replace(".", "_")
    library = caches.folder("kernels") / f"then_{sha[:12]}_max{max_version}.mojoc"
    if library.is_file():
        return library
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "kernels_then"
        package.mkdir()
        for name in git("ls-tree", "--name-only", f"{sha}:{folder}").split():
            (package / name).write_text(renamed(git("show", f"{sha}:{folder}/{name}")))
        precompile(package, library)
    return library


# What an op's inputs must read at another revision for this tree's arrays to fit it: Q8_0's
# scales became float16 bits in a uint16 array (model/quantize.py's interleave_q8_0).
INPUTS = {"q8_0": "scales: InputTensor[dtype=DType.uint16"}


def has_op(rev: str, kind: str) -> bool:
    """Whether model/kernels at ``rev`` registers ``few_rows_matmul_<kind>``
    taking the inputs this tree gives it."""
    wanted = [f'register("few_rows_matmul_{kind}")', *([INPUTS[kind]] if kind in INPUTS else [])]
    return all(kernels_at_hold(rev, text) for text in wanted)


def takes(rev: str) -> frozenset[str]:
    """The compile-time parameters of this tree's ops (``isa``, ``isa1``,
    q4_0's ``band`` and ``ahead``) that model/kernels at ``rev`` declares: older revisions
    had fewer."""
    return frozenset(name for name in ("isa", "isa1", "band", "ahead") if kernels_at_hold(rev, f", {name}: Int"))


def kernels_at_hold(rev: str, text: str) -> bool:
    """Whether a file of model/kernels at git revision ``rev`` holds ``text``."""
    from model.layers.custom_op import KERNELS

    folder = KERNELS.relative_to(ROOT).as_posix()
    return subprocess.run(["git", "grep", "-q", "-F", text, rev, "--", folder], cwd=ROOT).returncode == 0


def compare_paths(session, libraries, weights: dict, exact: dict, dense, biases, shapes, args, rounds: int, rng):
    """--paths: each of this project's kernels compiled on each path, the
    paths alternated within every round, so that the machine's drift falls
    on all of them alike; per row count and kernel, each path's median
    (the rounds' range) and its speed relative to the first path."""
    from max.driver import Buffer

    print(f"{'rows':>4} {'kernel':<6} " + " ".join(f"{path:>28}" for path in args.paths))
    for rows in args.rows:
        x = rng.standard_normal((rows, shapes[0][1]), dtype=np.float32)
        for kind, (arrays, _) in weights.items():
            inputs = [Buffer.from_numpy(a) for a in (x, *arrays, *(biases or []))]
            want = reference(x, exact.get(kind, dense), shapes, args.chain, biases)
            models = {}
            for path in args.paths:
                models[path] = session.load(graph(kind, rows, shapes, libraries=libraries, chain=args.chain,
                                                  path=path, epilogue=args.epilogue))
                got = [t.to_numpy() for t in models[path].execute(*inputs)]
                diff = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(got, want))
                # A quantized kind rounds its input to 8 bits at every matmul:
                # chained, 49 roundings compound (~5e-2 on random weights).
                if diff > (1e-4 if kind == "f32" else 0.1 if args.chain else 3e-2):
                    raise SystemExit(f"{kind} on the {path} path differs from numpy by {diff:.1e}")
            times: dict[str, list[float]] = {path: [] for path in args.paths}
            for _ in range(rounds):
                for path in args.paths:
                    times[path].append(timed(models[path], inputs, args.reps))
            first = statistics.median(times[args.paths[0]])
            cells = []
            for path in args.paths:
                median = statistics.median(times[path])
                cells.append(f"{median * 1e3:6.2f} ({min(times[path]) * 1e3:.2f}-{max(times[path]) * 1e3:.2f}) "
                             f"{first / median:4.2f}x")
            print(f"{rows:>4} {kind:<6} " + " ".join(f"{c:>28}" for c in cells))
    print(f"(ms: the median of {rounds} rounds' medians, the rounds' range; x: the first path's time / this one's, "
          "above 1 this path is faster)")


def main(argv: list[str] | None = None) -> int:
    from model import cpu as cpu_paths

    p = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32], help="row counts (default: 1 4 8 16 32)")
    p.add_argument("--reps", type=int, default=20, help="calls per figure; medians (default: 20)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--hot", action="store_true", help="two weight matrices used 12 times each: weights in cache")
    which.add_argument("--step", action="store_true",
                       help="a whole decode step's matmuls (attention, MLP, LM head) instead of the 24 MLP ones")
    which.add_argument("--tiny", action="store_true",
                       help="48 matmuls of [32, 64]: each op's fixed cost (its launch, waking the cores, rounding "
                            "the input), the part of a step that does not shrink with the weights")
    p.add_argument("--chain", action="store_true",
                   help="feed each matmul from the one before (as in the model: each waits for the last), "
                        "not from the input (independent matmuls, which MAX's runtime may overlap)")
    p.add_argument("--epilogue", action="store_true",
                   help="add a bias to every product and gelu to c_fc's, as the model does (MAX fuses them into "
                        "the matmul's op, which then stores through them)")
    p.add_argument("--against", metavar="REV",
                   help="also time model/kernels as of git revision REV, alternated with this tree's")
    p.add_argument("--rounds", type=int, help="alternations of every kernel (default: 1, or 5 with --against)")
    p.add_argument("--paths", nargs="+", choices=list(cpu_paths.PATHS), metavar="PATH",
                   help="time this project's kernels on each of these paths instead, alternated in one process "
                        "(--rounds, default 5): which path is faster on this CPU, per row count")
    p.add_argument("--path", default="auto", choices=list(cpu_paths.PATHS),
                   help="this tree's kernel path, for one row and several (model/cpu.py; default: auto, the "
                        "CPU's own, or its microarchitecture's path for one row)")
    args = p.parse_args(argv)
    rounds = args.rounds or (5 if args.against or args.paths else 1)
    shapes = STEP_SHAPES if args.step else TINY_SHAPES if args.tiny else SHAPES
    from max.driver import CPU, Buffer
    from max.engine import InferenceSession

    from model.cpu import q4_0_band
    from model.layers.custom_op import kernel_library
    from model.quantize import (
        dequantize_q4_0,
        dequantize_q8_0,
        interleave_q8_0,
        pack_q4_0,
        quantize_q4_0,
        quantize_q8_0,
        with_padded_rows,
    )

    rng = np.random.default_rng(0)
    distinct = 2 if args.hot else len(shapes)
    made = [rng.standard_normal(s, dtype=np.float32) for s in shapes[:distinct]]
    dense = [made[i % distinct] for i in range(len(shapes))]
    biases = [rng.standard_normal(s[0], dtype=np.float32) for s in shapes] if args.epilogue else None
    q8 = [quantize_q8_0(w) for w in dense]
    libraries = [kernel_library()] + ([library_at(args.against)] if args.against else [])
    session = InferenceSession(devices=[CPU()], custom_extensions=libraries)
    q8_arrays = [a for pair in q8 for a in interleave_q8_0(*pair)]
    f32_bytes, q8_bytes = sum(w.nbytes for w in dense), sum(c.nbytes + d.nbytes for c, d in q8)
    q4 = [quantize_q4_0(with_padded_rows(w)) for w in dense]  # rows padded to MAX's bands of 32
    q4_arrays = [pack_q4_0(b, q4_0_band()) for b in q4]  # in the band MAX's kernel reads here
    q4_bytes = sum(b.nbytes for b in q4)
    weights = {"f32": (dense, f32_bytes), "max": (dense, f32_bytes), "q8_0": (q8_arrays, q8_bytes),
               "q4_0": (q4_arrays, q4_bytes), "q4_0_max": (q4_arrays, q4_bytes)}
    against = [k for k in ("f32", "q8_0", "q4_0") if not args.against or has_op(args.against, k)]
    then_takes = takes(args.against) if args.against else frozenset()
    if args.against:
        weights.update({kind + THEN: weights[kind] for kind in against})
    q8_dense = [dequantize_q8_0(c, d) for c, d in q8]
    q4_dense = [dequantize_q4_0(b)[:len(w)] for b, w in zip(q4, dense)]
    exact = {"q8_0": q8_dense, "q4_0": q4_dense}
    what = ("a decode step's 49 matmuls" if args.step else "48 tiny matmuls ([32, 64])" if args.tiny
            else "24 MLP matmuls" + (" (weights in cache)" if args.hot else ""))
    what += ", each fed from the one before" if args.chain else ""
    what += ", each + a bias (and c_fc's gelu)" if args.epilogue else ""
    print(f"GPT-2 124M's {what}; medians of {args.reps}"
          + (f", then of {rounds} alternated rounds" if rounds > 1 else ""))
    if args.paths:
        compare_paths(session, libraries, {k: weights[k] for k in ("f32", "q8_0", "q4_0")}, exact, dense, biases,
                      shapes, args, rounds, rng)
        return 0
    print(f"{'rows':>4} {'kernel fp32':>22} {'MAX x @ W.T':>22} {'ratio':>6} {'kernel q8_0':>22} "
          f"{'kernel q4_0':>22} {'MAX q4_0':>22} {'ratio':>6}  largest rel. diff")
    for rows in args.rows:
        x = rng.standard_normal((rows, shapes[0][1]), dtype=np.float32)
        models, inputs, diffs = {}, {}, {}
        for kind, (arrays, _) in weights.items():
            models[kind] = session.load(graph(kind, rows, shapes, libraries=libraries, chain=args.chain, path=args.path,
                                              epilogue=args.epilogue, then_takes=then_takes))
            # MAX buffers, made once: handed numpy arrays, every call converts
            # each of them again, which added milliseconds to the figures.
            inputs[kind] = [Buffer.from_numpy(a) for a in (x, *arrays, *(biases or []))]
            got = [t.to_numpy() for t in models[kind].execute(*inputs[kind])]
            want = reference(x, exact.get(kind[:4], dense), shapes, args.chain, biases)
            diffs[kind] = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(got, want))
        times: dict[str, list[float]] = {kind: [] for kind in models}
        for _ in range(rounds):
            for kind in models:
                times[kind].append(timed(models[kind], inputs[kind], args.reps))
        seconds = {kind: statistics.median(t) for kind, t in times.items()}
        cells = [f"{seconds[k] * 1e3:8.2f} ms {weights[k][1] / seconds[k] / 1e9:6.1f} GB/s"
                 for k in ("f32", "max", "q8_0", "q4_0", "q4_0_max")]
        print(f"{rows:>4} {cells[0]:>22} {cells[1]:>22} {seconds['max'] / seconds['f32']:5.2f}x {cells[2]:>22} "
              f"{cells[3]:>22} {cells[4]:>22} {seconds['q4_0_max'] / seconds['q4_0']:5.2f}x  "
              + " / ".join(f"{diffs[k]:.1e}" for k in ("f32", "max", "q8_0", "q4_0", "q4_0_max")))
        if args.against:
            print(f"     {args.against}: " + "; ".join(
                f"{kind} {seconds[kind + THEN] * 1e3:.2f} ms "
                f"({min(times[kind + THEN]) * 1e3:.2f}-{max(times[kind + THEN]) * 1e3:.2f}) "
                f"vs now {seconds[kind] * 1e3:.2f} ({min(times[kind]) * 1e3:.2f}-{max(times[kind]) * 1e3:.2f}): "
                f"{seconds[kind + THEN] / seconds[kind]:.2f}x, diff {diffs[kind + THEN]:.1e}" for kind in against))
    print("(ratios: MAX's time / the kernel's, fp32 and q4_0; above 1 the kernel wins. q8_0 and q4_0 round the "
          "activations to 8 bits per block of 32, as llama.cpp and MAX's q4_0 kernel do: their difference from "
          "numpy's product with the dequantized weights is ~1e-2 (q8_0 above 32 rows with AVX2, 16 on the "
          "portable path: float32 activations, ~1e-6)"
          + (", more along a --chain" if args.chain else "")
          + ("; --against: the revision's time / this tree's, above 1 this tree is faster" if args.against else "")
          + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
