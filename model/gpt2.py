"""The one model build: every caller gets its GPT-2 from ``load_gpt2``.

    gpt2 = load_gpt2("gpt2")                                  # hub id or folder; device/dtype auto
    gpt2 = load_gpt2("gpt2", BuildOptions(dtype="q4_0"))      # what to build: model/options.py
    gpt2 = load_gpt2("gpt2", dtype="q4_0")                    # the same, its fields as keywords
    logits, cache = gpt2.step(ids, gpt2.empty_cache(batch=1)) # model/runtime.py

``load_gpt2`` is a pipeline, options -> checkpoint -> module -> compiled graph:

    model/options.py      BuildOptions: impl, device, dtype, linear, cache,
                          attention_layer; ``placement`` resolves device and dtype
    weights/folder.py     the hub id or folder -> a Checkpoint: its folder,
                          config (step 01's GPT2Config) and tokenizer, read once
    weights/checkpoint.py safetensors -> {name: float32 array}: Conv1D weights
                          transposed, buffers dropped, shapes verified,
                          lm_head tied to wte (copies kept by model/caches.py)
    model/course.py       the course's classes: solutions/ or the learner's steps/
    model/graph.py        build_lm: GPT2LMHeadModel(config, linear, attention)
                          under F.lazy(), its Linear layers from model/layers/
                          (this project's ops for float32 on the CPU and q8_0 /
                          q4_0, MAX's qmatmul for q6_k; nn.Linear otherwise),
                          its attention step 07's (or step 15's for the
                          attention map), each layer's cache an object its
                          forward calls (model/kv_cache.py's, kept in
                          place); then the graph around it, compiled
    model/quantize.py     quantize_state: blocks for exactly the quantized layers
                          (kept by model/caches.py)
    model/graph_source.py where the compiled graph comes from, decided before
                          the build: saved (model/saved_graphs.py: a MEF driven
                          directly, nothing traced), shipped with the project
                          (shipped/app-graph/), or compiled
    model/runtime.py      GPT2: the cache, one graph call, logits on the host
    model/generate.py     prefill once, then one token per step; sampling.py picks
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from model import caches, saved_graphs
from model.course import IMPLS, config_class, course
from model.graph_source import graph_to_load
from model.options import BuildOptions
from model.runtime import GPT2
from weights import Checkpoint, load_state, open_checkpoint

__all__ = ["GPT2", "IMPLS", "BuildOptions", "load_gpt2"]


def load_gpt2(model: str | Path | Checkpoint, options: BuildOptions | None = None, *, with_tokenizer: bool = True,
              **fields) -> GPT2:
    """Build, load and compile a GPT-2 checkpoint as ``options`` say.

    ``model``: a hub id, a folder, ``demo``, or a Checkpoint the caller has
    opened already (``weights.open_checkpoint``: then nothing is read twice).
    ``fields``: BuildOptions' fields as keywords, over ``options``.
    ``with_tokenizer``: False when only token ids go in and out (the bench).

    Raises ``weights.WeightsError`` or ``model.device.DeviceError`` with a
    one-line message for anything the user can fix."""
    options = replace(options or BuildOptions(), **fields)
    placement = options.placement  # a device the machine lacks is refused before anything is read
    checkpoint, config, graph_config = opened(model, options)
    name = graph_to_load(checkpoint, config, graph_config, options, opened, traced_graph)
    tokenizer = checkpoint.tokenizer if with_tokenizer else None
    folder = checkpoint.folder
    state = checkpoint_state(folder, config, graph_config)  # every shape verified before building
    direct = placement.dtype != "bfloat16"
    store = saved_graphs.store_for(name, placement.max_device(), direct)
    if store.damaged:  # set aside: found again where it can be (a shipped graph unpacked anew), else compiled
        store.discard()
        name = graph_to_load(checkpoint, config, graph_config, options, opened, traced_graph)
        store = saved_graphs.store_for(name, placement.max_device(), direct)
    # The course's model is built to be traced, and to say which layers are
    # quantized; a saved graph driven directly needs neither (its facts say).
    specs = store.facts.get("quantized") if store.direct else None
    lm = kit = None
    if not store.direct or (placement.quantization and specs is None):
        from model.graph import build_lm

        kit = course(options.impl)
        lm = build_lm(kit, graph_config, options)
    if placement.quantization and lm is not None:
        from model.layers import quantized_specs

        specs = quantized_specs(lm)
    weights = graph_weights(state, folder, placement, specs)
    held = weight_bytes(weights, placement)
    if placement.dtype == "bfloat16":
        weights = as_bfloat16(weights)
    start = time.perf_counter()
    if store.direct:  # run the saved graph as it is: no tracing
        compiled, quantized = store.run(weights), store.facts["quantized_layers"]
    else:  # trace, then compile (or find the saved graph that matches)
        from model.graph import compile_graph, wrap
        from model.layers import quantized_that_ran

        compiled = compile_graph(wrap(lm, kit, options, config.vocab_size), config, options, weights, store)
        quantized = quantized_that_ran(lm)
        store.keep({"quantized_layers": quantized, "quantized": specs or {}})
    return GPT2(config, options, compiled, time.perf_counter() - start, tokenizer, str(folder),
                quantized_layers=quantized, saved_graph=store.loaded,
                eos_token_ids=checkpoint.eos_token_ids(with_tokenizer),
                weight_bytes=held)


def opened(model: str | Path | Checkpoint, options: BuildOptions):
    """The checkpoint, its config as the course's class, and the config the
    graph is built for (a GPU's head is wider); an attention layer the model
    lacks refused."""
    checkpoint = open_checkpoint(model)
    config = checkpoint.config_as(config_class(options.impl))
    if options.attention_layer is not None and not 0 <= options.attention_layer < config.n_layer:
        raise ValueError(f"attention_layer {options.attention_layer}: the model has layers 0-{config.n_layer - 1}")
    return checkpoint, config, as_in_graph(config, options.placement)


def checkpoint_state(folder: Path, config, graph_config) -> dict:
    """The checkpoint's float32 arrays (every shape verified), the head
    widened to the graph's vocabulary."""
    return with_vocab_rows(load_state(folder, config, caches.float32_copies(folder)), graph_config.vocab_size)


def graph_weights(state: dict, folder: Path, placement, specs: dict | None) -> dict:
    """``state`` as the graph is given it, by its weights' names: the
    quantized layers' blocks in place of their arrays (``specs``: which
    layers, as model/layers' quantized_specs says)."""
    if placement.quantization:
        from model.quantize import saved_quantize_state

        state = saved_quantize_state(specs, state, folder)
    return {"lm." + key: array for key, array in state.items()}


def traced_graph(config, options: BuildOptions):
    """The graph ``load_gpt2`` compiles for ``config`` and ``options``,
    traced, not compiled (MAX's Graph: model/graph_source.py compares its body
    with the shipped graph's)."""
    from model.graph import build_lm, trace_graph, wrap

    kit = course(options.impl)
    lm = build_lm(kit, as_in_graph(config, options.placement), options)
    return trace_graph(wrap(lm, kit, options, config.vocab_size), config, options)


# The LM head's output width on a GPU: GPT-2's 50257 (odd) rounded up to a
# multiple of 64, the rows past the vocabulary zero, their logits cut off in
# the graph. On an H200 in bfloat16 the head scored several rows at once
# wrongly at width 50257 (one row at a time was right): docs/gpu.md.
VOCAB_MULTIPLE = {"gpu": 64}


def graph_vocab(vocab_size: int, placement) -> int:
    """The LM head's width in the graph built for ``placement``."""
    multiple = VOCAB_MULTIPLE.get(placement.kind, 1)
    return -(-vocab_size // multiple) * multiple


def as_in_graph(config, placement):
    """``config`` as the graph built for ``placement`` is shaped: its head ``graph_vocab`` rows wide."""
    return replace(config, vocab_size=graph_vocab(config.vocab_size, placement))


def with_vocab_rows(state: dict, width: int) -> dict:
    """``state`` with the (tied) embedding and head widened to ``width`` rows,
    the new rows zero; a tied array stays one array."""
    import numpy as np

    done: dict[int, object] = {}

    def widen(a):
        if id(a) not in done:
            done[id(a)] = np.concatenate([a, np.zeros((width - a.shape[0], a.shape[1]), a.dtype)])
        return done[id(a)]

    rows = ("transformer.wte.weight", "lm_head.weight")
    return {name: widen(a) if name in rows and a.shape[0] < width else a for name, a in state.items()}


def as_bfloat16(weights: dict) -> dict:
    """float32 arrays as bfloat16 driver buffers, rounded as MAX's own cast
    rounds (to nearest, ties to even), in numpy. Left to MAX (``auto_cast``),
    each weight is cast by an eager program compiled per weight shape on the
    host, a compile for every model size before the graph's own. A tied array
    is converted once."""
    from max.driver import Buffer
    from max.dtype import DType

    done: dict[int, object] = {}

    def convert(a):
        if a.dtype.name != "float32":
            return a
        if id(a) not in done:
            done[id(a)] = Buffer.from_numpy(bfloat16_bits(a)).view(DType.bfloat16, a.shape)
        return done[id(a)]

    return {name: convert(a) for name, a in weights.items()}


def bfloat16_bits(a):
    """A float32 array's values rounded to bfloat16 (to nearest, ties to even,
    as MAX's cast), as their 16-bit patterns (uint16)."""
    import numpy as np

    bits = np.ascontiguousarray(a).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(a)] = 0x7FC0  # rounding could carry a NaN's payload into infinity
    return rounded


def weight_bytes(weights: dict, placement) -> int:
    """The bytes the graph holds for ``weights`` (each array once): as given,
    except float32 arrays that a bfloat16 build casts to 2 bytes a value."""
    arrays = {id(a): a for a in weights.values()}.values()
    if placement.dtype == "bfloat16":
        return sum(a.size * 2 if a.dtype.name == "float32" else a.nbytes for a in arrays)
    return sum(a.nbytes for a in arrays)
