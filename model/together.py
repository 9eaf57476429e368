"""Several CPU builds compiled by MAX as one unit.

    builds = [prepare(folder, device="cpu", dtype=dtype) for dtype in ("q8_0", "q4_0")]
    q8_0, q4_0 = compile_together(builds)         # one GPT2 each, as load_gpt2 gives them

Most of a compile's time is spent once per compile, whatever its graphs
hold: one matmul's graph costs most of what a whole model's does
(``python -m bench.compile_together`` measures it;
docs/decisions/0008-suite-graphs-in-units.md). MAX compiles several
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

A unit can also hold graphs that are not GPT-2 builds (``Other``: a module,
its input types and weights), saved in the bundle under a name taken from
what the traced graph computes; ``Other.saved()`` finds one there:

    layers = Other(module, input_types, weights)
    compile_together(builds, others=[layers])     # in one process
    run = layers.saved() or layers.compile()      # in any other: called as MAX's compiled module is
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
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


@dataclass(eq=False)
class Other:
    """A graph that is not a GPT-2 build: ``module`` (an nn.Module built
    lazily) traced with ``input_types``, ``weights`` by the module's names
    for them. A unit holding one is compiled with this project's kernel
    library (such a graph may call its ops)."""

    module: object
    input_types: list
    weights: dict = field(repr=False)

    @cached_property
    def name(self) -> str:
        """``graph_<digest>``: its saved graph's name, from what its traced
        body computes (model/graph_source.py's graph_digest), the Mojo kernels it
        may call, and the machine's facts as model/saved_graphs.py's
        graph_name takes them."""
        from model.graph_source import graph_digest, kernels_digest
        from model.saved_graphs import machine_facts

        traced = self.module.trace(*self.input_types, name="other").graph
        facts = {**machine_facts(), "kernels": kernels_digest(), "graph": graph_digest(traced)}
        return "graph_" + hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]

    def saved(self):
        """Its graph as a unit saved it, called as MAX's compiled module is
        (tensors in, buffers out); None when no unit saved it."""
        from max.driver import CPU, Buffer

        from model import saved_graphs

        if not saved_graphs.is_saved(self.name):
            return None
        store = saved_graphs.store_for(self.name, CPU())
        if not store.direct:  # damaged, set aside: compiled again by its caller
            store.discard()
            return None
        engine_model = store.run(self.weights).engine_model
        return lambda *inputs: engine_model.execute(*(Buffer.from_dlpack(x) for x in inputs))

    def compile(self):
        """Its graph compiled alone (MAX's compiled module)."""
        return self.module.compile(*self.input_types, weights=self.weights)


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


def compile_together(builds: list[Prepared], others: list[Other] = ()) -> list[GPT2]:
    """``builds`` and ``others`` compiled as one unit and saved as one bundle:
    a GPT2 for each build, in order (``Other.saved()`` finds the others)."""
    from max.driver import CPU, Buffer
    from max.engine import InferenceSession

    from model import saved_graphs
    from model.graph import OneOf, one_module, trace_graph, wrap
    from model.layers import quantized_that_ran
    from model.layers.custom_op import kernel_library

    start = time.perf_counter()
    other_names = [other.name for other in others]  # (each traced alone first, as Other.saved names it)
    every = OneOf([*(wrap(build.lm, build.kit, build.options, build.config.vocab_size) for build in builds),
                   *(other.module for other in others)])
    names = [f"gpt2_{i}" for i in range(len(builds))] + [f"other_{i}" for i in range(len(others))]  # in the unit
    prefixes = [f"builds.{i}." for i in range(len(names))]  # each graph's weights' names there (OneOf)
    weights = [build.weights for build in builds] + [other.weights for other in others]
    graphs = []
    for i, build in enumerate(builds):
        every.which = i
        graphs.append(trace_graph(every, build.config, build.options, name=names[i]))
    for i, other in enumerate(others, len(builds)):
        every.which = i
        graphs.append(every.trace(*other.input_types, name=names[i]).graph)
    registry = {prefixes[i] + key: Buffer.from_dlpack(array) for i, arrays in enumerate(weights)
                for key, array in arrays.items()}
    ran = [quantized_that_ran(build.lm) for build in builds]  # known once traced
    session = InferenceSession(devices=[CPU()])
    kernels = any(build.options.uses_kernels for build in builds) or bool(others)
    print(f"compiling {len(names)} graphs as one ...", file=sys.stderr, flush=True)
    compiled = session.compile(one_module(graphs), custom_extensions=[kernel_library()] if kernels else [])
    facts = [{"quantized_layers": ran[i], "quantized": build.specs or {}} for i, build in enumerate(builds)]
    facts += [{} for _ in others]
    members = [(member, {**facts[i], "bundle": {"graph": names[i], "prefix": prefixes[i]}})
               for i, member in enumerate([build.name for build in builds] + other_names)]
    saved_graphs.keep_bundle(compiled, members, {names[i]: [prefixes[i] + key for key in arrays]
                                                 for i, arrays in enumerate(weights)})
    models = session.init_all(compiled, weights_registry=registry)
    seconds = time.perf_counter() - start
    print(f"compiled in {seconds:.1f} s", file=sys.stderr, flush=True)
    return [GPT2(build.config, build.options, SimpleNamespace(engine_model=models[names[i]]), seconds,
                 build.checkpoint.tokenizer if build.with_tokenizer else None, str(build.checkpoint.folder),
                 quantized_layers=ran[i], eos_token_ids=build.checkpoint.eos_token_ids(build.with_tokenizer),
                 weight_bytes=weight_bytes(build.weights, build.options.placement))
            for i, build in enumerate(builds)]
