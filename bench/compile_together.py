"""``python -m bench.compile_together``: what a compile costs when it holds
several graphs.

MAX compiles a graph and its kernels as one unit, and most of that time is
spent once per compile, whatever the graph holds: a graph with one matmul
costs nearly what one with four of different shapes does. MAX can also
compile several graphs as one unit (a ``max.graph.Module`` holding each
graph, ``InferenceSession.compile``, then ``init_all`` gives one model per
graph). This measures both ways, each compile in a new process with an empty
MAX cache (this project's kernel library is built before the clock starts;
no saved or shipped graph is used):

    python -m bench.compile_together            # matmul graphs: 1 alone, 3 in one module, 3 one after another
    python -m bench.compile_together --app      # the demo's app build and its concat-cache build:
                                                # each alone (load_gpt2), then both in one
                                                # compile (model.together.compile_together)

The test suite compiles the model graphs its files load a group at a time
(tests/suite_graphs.py, through ``model.together.compile_together``;
docs/decisions/0008-suite-graphs-in-units.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(48, 37), (64, 50), (128, 384)]  # (in, out) of each matmul graph
# The app's builds compile every time: no saved graph, no shipped one.
NO_SAVED = {"GPT2_MAX_SAVED_GRAPHS": "0", "GPT2_MAX_PORTABLE_GRAPH": "0"}
RUNS = {"matmul": ["matmul-1", "matmul-3-together", "matmul-3-apart"],
        "app": ["app-in_place", "app-concat", "app-both-together"]}


def matmul_graphs(n: int, module=None) -> list:
    """``n`` graphs, each x [rows, in] @ w [in, out] then gelu, in ``module`` when given."""
    from max.driver import CPU
    from max.dtype import DType
    from max.graph import Graph, TensorType, ops

    graphs = []
    for i, (k, m) in enumerate(SHAPES[:n]):
        types = [TensorType(DType.float32, ["rows", k], device=CPU()), TensorType(DType.float32, [k, m], device=CPU())]
        with Graph(f"matmul{i}", input_types=types, module=module) as graph:
            x, w = graph.inputs
            graph.output(ops.gelu(ops.matmul(x, w)))
        graphs.append(graph)
    return graphs


def child(run: str) -> float:
    """One run's seconds, in this process (its MAX cache set by the parent):
    the compile of the matmul graphs, or the demo's whole build."""
    from max.driver import CPU
    from max.engine import InferenceSession
    from max.graph import Module

    if run.startswith("app"):
        from model.gpt2 import load_gpt2
        from model.layers.custom_op import kernel_library
        from model.together import compile_together, prepare

        kernel_library()  # built (or found) before the clock starts
        caches = {"app-in_place": ["in_place"], "app-concat": ["concat"]}.get(run, ["in_place", "concat"])
        start = time.perf_counter()
        if run == "app-both-together":
            compile_together([prepare("demo", device="cpu", dtype="float32", cache=cache, with_tokenizer=False)
                              for cache in caches])
        else:
            load_gpt2("demo", device="cpu", dtype="float32", cache=caches[0], with_tokenizer=False)
        return time.perf_counter() - start
    session = InferenceSession(devices=[CPU()])
    if run == "matmul-3-together":
        module = Module()
        matmul_graphs(3, module)
        units = [module]
    else:
        units = matmul_graphs(1 if run == "matmul-1" else 3)
    start = time.perf_counter()
    for unit in units:
        session.load_all(unit)  # compiled, then bound (no weights)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_together", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--app", action="store_true", help="the demo's two app graphs instead of matmul graphs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps({"s": child(args.child)}))
        return 0
    print(f"{'run':<22} compile s (an empty MAX cache each)")
    for run in RUNS["app" if args.app else "matmul"]:
        with tempfile.TemporaryDirectory(prefix="max-cache-") as cache:
            done = subprocess.run([sys.executable, "-m", "bench.compile_together", "--child", run], cwd=ROOT,
                                  env=dict(os.environ, MODULAR_CACHE_DIR=cache, **NO_SAVED), capture_output=True,
                                  text=True)
        if done.returncode != 0:
            print(f"{run:<22} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        print(f"{run:<22} {json.loads(done.stdout.strip().splitlines()[-1])['s']:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
