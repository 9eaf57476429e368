"""``python -m bench.compile_together``: what a compile costs when it holds
several graphs.

MAX compiles a graph and its kernels as one unit, and most of that time is
spent once per compile, whatever the graph holds: on 2 cores a graph with one
matmul took ~80 s, one with four of different shapes ~90 s. MAX can also
compile several graphs as one unit (a ``max.graph.Module`` holding each
graph, ``InferenceSession.compile``, then ``init_all`` gives one model per
graph). This measures both ways, each compile in a new process with an empty
MAX cache (this project's kernel library is built before the clock starts):

    python -m bench.compile_together            # matmul graphs: 1 alone, 3 in one module, 3 one after another
    python -m bench.compile_together --app      # the demo's app graph and its concat-cache graph:
                                                # each alone, then both in one module

Where a test suite compiles many graphs (each 1.5-3 min on 2 cores), this is
what compiling them together would give.
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


def app_graphs(caches: list[str]) -> list:
    """The demo's app graph for each cache kind, traced (not compiled), each its own graph."""
    from model.course import config_class
    from model.gpt2 import traced_graph
    from model.options import BuildOptions
    from weights import open_checkpoint, resolve_model

    config = open_checkpoint(resolve_model("demo")).config_as(config_class("solutions"))
    return [traced_graph(config, BuildOptions(device="cpu", dtype="float32", cache=cache)) for cache in caches]


def together(graphs: list):
    """``graphs`` moved into the first one's module, each under its own name: one unit to compile."""
    from max.graph import Module

    module = graphs[0].module.mlir_module
    [last] = list(module.body)
    for i, graph in enumerate(graphs[1:], 1):
        [op] = list(graph.module.mlir_module.body)
        op.sym_name = f"{op.sym_name}_{i}"
        op.move_after(last)
        last = op
    return Module(mlir_module=module)


def child(run: str) -> float:
    """One run's compile seconds, in this process (its MAX cache set by the parent)."""
    from max.driver import CPU
    from max.engine import InferenceSession
    from max.graph import Module

    session = InferenceSession(devices=[CPU()])
    if run.startswith("matmul"):
        extensions = []
        if run == "matmul-3-together":
            module = Module()
            matmul_graphs(3, module)
            units = [module]
        else:
            units = matmul_graphs(1 if run == "matmul-1" else 3)
    else:
        from model.layers.custom_op import kernel_library

        extensions = [kernel_library()]  # built (or found) before the clock starts
        caches = {"app-in_place": ["in_place"], "app-concat": ["concat"]}.get(run, ["in_place", "concat"])
        graphs = app_graphs(caches)
        units = [together(graphs)] if run == "app-both-together" else graphs
    start = time.perf_counter()
    for unit in units:
        compiled = session.compile(unit, custom_extensions=extensions)
        assert compiled is not None
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
                                  env=dict(os.environ, MODULAR_CACHE_DIR=cache), capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{run:<22} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        print(f"{run:<22} {json.loads(done.stdout.strip().splitlines()[-1])['s']:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
