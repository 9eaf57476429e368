"""Several CPU builds compiled by MAX as one unit.

    builds = [prepare(folder, device="cpu", dtype=dtype) for dtype in ("q8_0", "q4_0")]
    q8_0, q4_0 = compile_together(builds)         # one GPT2 each, as load_gpt2 gives them

Most of a compile's time is spent once per compile, whatever its graphs
hold: on 2 cores one matmul's graph took ~80 s, the demo's whole graph ~2 min
(``python -m bench.compile_together`` measures it). MAX compiles several
graphs as one unit (a module holding each graph; ``init_all`` then gives a
model per graph), so a caller that needs several builds at once, as a test
comparing precisions or kernel paths does, pays for one compile.

``prepare`` builds the course's model as ``load_gpt2`` does (its layers'
kernel path, ``$GPT2_MAX_KERNEL_PATH``, read then) and reads its weights;
``compile_together`` traces each build with its weights' names under its
index (one registry binds them all: model/graph.py's OneOf), compiles once,
and drives each model as a saved graph is driven. The unit is saved as one
bundle (model/saved_graphs.py), so a later ``load_gpt2`` of any of these
builds, in any process, loads its graph from there: the test suite compiles
the graphs its files load in a few such units before their tests run
(tests/suite_graphs.py).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from model.course import course
from model.gpt2 import GPT2, checkpoint_state, graph_weights, opened, weight_bytes
from model.options import BuildOptions
from weights import Checkpoint


@dataclass
class Prepared:
    """One CPU build made up to its compile."""

    options: BuildOptions
    checkpoint: Checkpoint
    config: object
    kit: object
    lm: object
    weights: dict
    with_tokenizer: bool
    name: str  # the graph's name in model/saved_graphs.py, as load_gpt2 would name it
    specs: dict | None  # the quantized layers (model/layers' quantized_specs)


def prepare(model: str | Path | Checkpoint, options: BuildOptions | None = None, *, with_tokenizer: bool = True,
            **fields) -> Prepared:
    """``load_gpt2``'s build of ``model`` up to the compile (same arguments)."""
    from model import saved_graphs
    from model.graph import build_lm

    options = replace(options or BuildOptions(), **fields)
    placement = options.placement
    if placement.kind != "cpu":
        raise ValueError("compile_together builds for the CPU only")
    checkpoint, config, graph_config = opened(model, options)
    state = checkpoint_state(checkpoint.folder, config, graph_config)
    kit = course(options.impl)
    lm = build_lm(kit, graph_config, options)
    specs = None
    if placement.quantization:
        from model.layers import quantized_specs

        specs = quantized_specs(lm)
    weights = graph_weights(state, checkpoint.folder, placement, specs)
    return Prepared(options, checkpoint, config, kit, lm, weights, with_tokenizer,
                    saved_graphs.graph_name(options, graph_config), specs)


def compile_together(builds: list[Prepared]) -> list[GPT2]:
    """``builds`` compiled as one unit and saved as one bundle: a GPT2 each, in order."""
    from max.driver import CPU, Buffer
    from max.engine import InferenceSession

    from model import saved_graphs
    from model.graph import OneOf, one_module, trace_graph, wrap
    from model.layers import quantized_that_ran
    from model.layers.custom_op import kernel_library

    start = time.perf_counter()
    every = OneOf([wrap(build.lm, build.kit, build.options, build.config.vocab_size) for build in builds])
    names = [f"gpt2_{i}" for i in range(len(builds))]  # each graph's name in the unit
    prefixes = [f"builds.{i}." for i in range(len(builds))]  # its weights' names there (OneOf)
    graphs, registry = [], {}
    for i, build in enumerate(builds):
        every.which = i
        graphs.append(trace_graph(every, build.config, build.options, name=names[i]))
        registry |= {prefixes[i] + key: Buffer.from_dlpack(array) for key, array in build.weights.items()}
    ran = [quantized_that_ran(build.lm) for build in builds]  # known once traced
    session = InferenceSession(devices=[CPU()])
    extensions = [kernel_library()] if any(build.options.uses_kernels for build in builds) else []
    print(f"compiling {len(builds)} model graphs as one ...", file=sys.stderr, flush=True)
    compiled = session.compile(one_module(graphs), custom_extensions=extensions)
    members = [(build.name, {"quantized_layers": ran[i], "quantized": build.specs or {},
                             "bundle": {"graph": names[i], "prefix": prefixes[i]}})
               for i, build in enumerate(builds)]
    saved_graphs.keep_bundle(compiled, members, {names[i]: [prefixes[i] + key for key in build.weights]
                                                 for i, build in enumerate(builds)})
    models = session.init_all(compiled, weights_registry=registry)
    seconds = time.perf_counter() - start
    print(f"compiled in {seconds:.1f} s", file=sys.stderr, flush=True)
    return [GPT2(build.config, build.options, SimpleNamespace(engine_model=models[names[i]]), seconds,
                 build.checkpoint.tokenizer if build.with_tokenizer else None, str(build.checkpoint.folder),
                 quantized_layers=ran[i], eos_token_ids=build.checkpoint.eos_token_ids(build.with_tokenizer),
                 weight_bytes=weight_bytes(build.weights, build.options.placement))
            for i, build in enumerate(builds)]
