"""From the course's blocks to one compiled graph: build the module, wrap it, compile it.

    lm = build_lm(kit, config, options)             # GPT2LMHeadModel(config, linear, attention), lazily
    graph = wrap(lm, kit, options)                  # InPlaceGraph or ConcatGraph: the graph's inputs and outputs
    compiled = compile_graph(graph, config, options, weights, store)

The graph takes ``ids`` [batch, seq], ``positions`` [k] (the positions whose
logits to return: step 11's ``positions``) and the cache. Each layer's cache
is an object step 07's forward calls (``cache.update``, ``cache.attend``):
with the app's in-place cache (model/kv_cache.py's InPlaceCache) the inputs
are the rows this call writes (start, end), the cached length as a shape
(mark) and 2 * n_layer buffers [batch, n_head, capacity, head_dim] that it
writes in place; with step 07's own ConcatCache (``cache="concat"``, the
teaching block, kept beside the in-place one to prove both give the same
tokens: tests/test_kv_cache.py) the cached keys and values go in and the
concatenated ones come out; with the static cache (``cache="static"``,
InPlaceGraph's capture-safe twin: StaticGraph) the inputs are the cached
length as a device value (past) and the 2 * n_layer buffers, read and
written over their whole capacity, so that a decode step's launches do not
depend on the length and a GPU can replay them (model/runtime.py). It
returns the logits [batch, k, vocab]
(float32) and, when built with ``attention_layer``, that layer's
probabilities. Batch, sequence and cache lengths are symbolic: one compiled
graph prefills a prompt of any length and decodes, for the whole process.
"""

from __future__ import annotations

import sys
import time

from max.dtype import DType
from max.experimental import nn

from model.course import Course
from model.kv_cache import InPlaceCache, StaticCache
from model.layers import linear_maker
from model.options import BuildOptions


def build_lm(kit: Course, config, options: BuildOptions):
    """``GPT2LMHeadModel`` built lazily (no random init: the checkpoint fills
    it), its layers chosen by ``options``: model/layers' Linear for a
    quantized placement or float32 on the CPU (``linear_maker``), step 15's
    attention (which keeps its probabilities) where an attention layer is
    asked for. The dtype and device are always set explicitly: MAX's own
    defaults depend on the machine (the accelerator, in bfloat16, where one
    is present), so a CPU build on a machine with a GPU would otherwise get
    its parameters on the GPU."""
    from max.experimental import functional as F
    from max.experimental.tensor import default_device, default_dtype

    layers = {}
    linear = linear_maker(options)
    if linear is not None:
        layers["linear"] = linear
    if options.attention_layer is not None:
        layers["attention"] = kit.GPT2AttentionWithWeights
    with F.lazy(), default_dtype(options.placement.max_dtype()), default_device(options.placement.max_device()):
        return kit.GPT2LMHeadModel(config, **layers)


class _Graph(nn.Module):
    """What both graphs share: step 11's model, and the outputs it gives."""

    def __init__(self, lm, attention_layer: int | None, vocab_size: int) -> None:
        super().__init__()
        self.lm = lm
        self.attention_layer = attention_layer
        self.vocab_size = vocab_size  # the checkpoint's: the graph's head may be wider (graph_vocab)

    def outputs(self, logits, caches=()) -> tuple:
        """The logits (float32), the concatenated cache tensors where the
        cache is not in place, and one layer's attention probabilities
        (float32), kept by step 15's attention during the call (the other
        layers' are never materialised)."""
        if int(logits.shape[-1]) != self.vocab_size:
            logits = logits[..., : self.vocab_size]
        out = (logits.cast(DType.float32), *(t for cache in caches for t in (cache.keys, cache.values)))
        if self.attention_layer is not None:  # float32 here, in the graph: bfloat16 on a GPU would need a cast
            out += (self.lm.transformer.h[self.attention_layer].attn.kept.weights.cast(DType.float32),)
        return out


class ConcatGraph(_Graph):
    """Step 11's model with the course's cache (step 07's ConcatCache): flat
    tensors in and out, the cache among them."""

    def __init__(self, lm, kit: Course, attention_layer: int | None, vocab_size: int) -> None:
        super().__init__(lm, attention_layer, vocab_size)
        self.cache_class = kit.ConcatCache

    def forward(self, ids, positions, *past_flat):
        caches = [self.cache_class(k, v) for k, v in zip(past_flat[0::2], past_flat[1::2])]
        return self.outputs(self.lm(ids, caches, positions), caches)


class InPlaceGraph(_Graph):
    """Step 11's model over in-place cache buffers (model/kv_cache.py): ids,
    positions, the rows to write (start, end), the cached length as a shape
    (mark), 2 * n_layer buffers in; the logits (and one layer's
    probabilities) out. The buffers are written in place: no cache output."""

    def __init__(self, lm, kit: Course, attention_layer: int | None, vocab_size: int) -> None:
        super().__init__(lm, attention_layer, vocab_size)
        self.attend = kit.ConcatCache().attend  # step 07's mask and _attn call, over the buffers' rows

    def forward(self, ids, positions, start, end, mark, *buffers):
        caches = [InPlaceCache(keys, values, start, end, mark, self.attend)
                  for keys, values in zip(buffers[0::2], buffers[1::2])]
        return self.outputs(self.lm(ids, caches, positions))


class StaticGraph(_Graph):
    """Step 11's model over static cache buffers (model/kv_cache.py's
    StaticCache): ids, positions, the cached length as an int64 [1] device
    value (past), 2 * n_layer buffers in; the logits out. Every input is a
    device buffer and no shape carries the length, so the launches of a call
    depend only on the shapes of batch, seq and capacity: a GPU captures a
    decode step once per batch size and replays it (model/runtime.py).

    Only the top of the forward is the graph's own, as the server's is
    (serve/network.py): step 10 hands the cached length to step 06's
    embedding, whose ``Tensor.arange`` takes its bounds on the host, and here
    the length is a device value. So step 06's forward gives every
    position's vector and the rows at past .. past + seq are gathered from
    them; then step 10's blocks (each with its layer's cache) and ``ln_f``,
    and step 11's head on the rows ``positions`` names, as steps 10 and 11
    call them."""

    def __init__(self, lm, kit: Course, attention_layer: int | None, vocab_size: int) -> None:
        if attention_layer is not None:
            raise ValueError("the static cache builds no attention map (build it with cache='in_place')")
        super().__init__(lm, attention_layer, vocab_size)

    def forward(self, ids, positions, past, *buffers):
        from max.experimental import functional as F

        t = self.lm.transformer
        every = t.wpe(int(t.wpe.weight.shape[0]), 0)  # step 06's vector of each position of the window
        rows = past + F.arange(0, ids.shape[1], dtype=DType.int64, device=every.device)
        x = t.wte(ids) + F.gather(every, rows, axis=0)
        for block, keys, values in zip(t.h, buffers[0::2], buffers[1::2], strict=True):
            x = block(x, StaticCache(keys, values, past))
        return self.outputs(self.lm.lm_head(t.ln_f(F.gather(x, positions, axis=1))))


GRAPHS = {"in_place": InPlaceGraph, "static": StaticGraph, "concat": ConcatGraph}


def wrap(lm, kit: Course, options: BuildOptions, vocab_size: int):
    """The graph module around ``lm`` for the options' cache, its logits
    ``vocab_size`` wide (the checkpoint's vocabulary)."""
    return GRAPHS[options.kv_cache](lm, kit, options.attention_layer, vocab_size)


# Every graph is traced under one name: what it computes is in its body
# (a shipped graph is matched by a digest of it: model/graph_source.py), and each
# saved graph has its own folder (model/saved_graphs.py).
GRAPH_NAME = "gpt2"


def trace_graph(graph, config, options: BuildOptions, name: str = GRAPH_NAME):
    """``graph`` traced as ``compile_graph`` traces it, not compiled: MAX's Graph."""
    return graph.trace(*input_types(config, options), name=name).graph


class OneOf(nn.Module):
    """Several builds' graph modules (and a unit's graphs that are not a
    model's: model/together.py's Other), the weights of each named under its
    index (``builds.<i>.``) so that one registry binds them all; traced once
    per graph, ``which`` saying whose forward is traced."""

    def __init__(self, graphs: list) -> None:
        super().__init__()
        self.builds = nn.ModuleList(graphs)
        self.which = 0

    def forward(self, *inputs):
        return self.builds[self.which](*inputs)


def one_module(graphs: list):
    """Traced graphs, each named apart, moved into the first one's module:
    one unit for MAX to compile (``InferenceSession.compile``, then
    ``init_all`` gives a model per graph, by name)."""
    from max.graph import Module

    module = graphs[0].module.mlir_module
    [last] = list(module.body)
    for graph in graphs[1:]:
        [op] = list(graph.module.mlir_module.body)
        op.move_after(last)
        last = op
    return Module(mlir_module=module)


def compile_graph(graph, config, options: BuildOptions, weights: dict, store):
    """Trace ``graph`` and compile it for ``options.placement`` with
    ``weights`` (saving its MEF through ``store``: model/saved_graphs.py)."""
    start = time.perf_counter()
    try:
        compiled = graph.compile(*input_types(config, options), weights=weights, name=GRAPH_NAME,
                                 session=store.session)
    except BaseException:
        store.discard()
        raise
    if not store.loaded:
        print(f"compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return compiled


def input_types(config, options: BuildOptions) -> list:
    """The graph's input types for ``options`` (the module docstring's inputs)."""
    from max.graph import TensorType

    placement = options.placement
    device = placement.max_device()
    ids_type = TensorType(DType.int64, ["batch", "seq"], device=device)
    positions_type = TensorType(DType.int64, ["scored"], device=device)
    if options.kv_cache == "static":
        from max.graph import BufferType

        past = TensorType(DType.int64, [1], device=device)  # a device value: a replay reads it again
        buffer = BufferType(placement.max_dtype(), ["batch", config.n_head, "capacity", config.head_dim],
                            device=device)
        cache_types = [past] + [buffer] * (2 * config.n_layer)
    elif options.kv_cache == "in_place":
        from max.driver import CPU
        from max.graph import BufferType

        host = TensorType(DType.int64, [], device=CPU())  # slice bounds live on the host
        buffer = BufferType(placement.max_dtype(), ["batch", config.n_head, "capacity", config.head_dim],
                            device=device)
        cache_types = [host, host, TensorType(DType.int8, ["past"], device=CPU())] + [buffer] * (2 * config.n_layer)
    else:
        kv = TensorType(placement.max_dtype(), ["batch", config.n_head, "past", config.head_dim], device=device)
        cache_types = [kv] * (2 * config.n_layer)
    return [ids_type, positions_type, *cache_types]
