"""From the course's blocks to one compiled graph: build the module, wrap it, compile it.

    lm = build_lm(course(impl), config, options)   # GPT2LMHeadModel(config, linear, attention), lazily
    graph = InPlaceGraph(lm, attention_layer)       # or ConcatGraph: the graph's inputs and outputs
    compiled = compile_graph(graph, config, options, weights, store)

The graph takes ``ids`` [batch, seq], ``positions`` [k] (the positions whose
logits to return: step 11's ``positions``) and the cache: with the app's
in-place cache (model/kv_cache.py) the rows this call writes (start, end),
the cached length as a shape (mark) and 2 * n_layer buffers [batch, n_head,
capacity, head_dim] that it writes in place; with step 07's own cache
(``cache="concat"``, the teaching block, kept beside the in-place one to
prove both give the same tokens: tests/test_kv_cache.py) the cached keys and
values go in and the new ones come out. It returns the logits [batch, k,
vocab] (float32) and, when built with ``attention_layer``, that layer's
probabilities. Batch, sequence and cache lengths are symbolic: one compiled
graph prefills a prompt of any length and decodes, for the whole process.
"""

from __future__ import annotations

import sys
import time

from model.course import Course
from model.kv_cache import in_place
from model.layers import linear_maker
from model.options import BuildOptions


def build_lm(kit: Course, config, options: BuildOptions):
    """``GPT2LMHeadModel`` built lazily (no random init: the checkpoint fills
    it), its layers chosen by ``options``: model/layers' Linear for a
    quantized placement or float32 on the CPU (``linear_maker``), step 15's
    attention (which keeps its probabilities) where an attention layer is
    asked for, made to keep its cache in place (model/kv_cache.py) unless
    ``cache="concat"``. The dtype and device are always set explicitly: MAX's
    own defaults depend on the machine (the accelerator, in bfloat16, where one
    is present), so a CPU build on a machine with a GPU would otherwise get
    its parameters on the GPU."""
    from max.experimental import functional as F
    from max.experimental.tensor import default_device, default_dtype

    layers = {}
    linear = linear_maker(options)
    if linear is not None:
        layers["linear"] = linear
    attention = kit.GPT2AttentionWithWeights if options.attention_layer is not None else kit.GPT2MultiHeadAttention
    if options.cache == "in_place":
        attention = in_place(attention, kit.causal_mask)
    if attention is not kit.GPT2MultiHeadAttention:
        layers["attention"] = attention
    with F.lazy(), default_dtype(options.placement.max_dtype()), default_device(options.placement.max_device()):
        return kit.GPT2LMHeadModel(config, **layers)


def _outputs(lm, logits, attention_layer: int | None, cache: list = ()) -> tuple:
    """A graph's outputs: the logits (float32), the cache tensors where the
    cache is not in place, and one layer's attention probabilities (float32), kept by
    step 15's attention during the call (the other layers' are never
    materialised)."""
    from max.dtype import DType

    out = (logits.cast(DType.float32), *cache)
    if attention_layer is not None:  # float32 here, in the graph: bfloat16 on a GPU would need a cast of its own
        out += (lm.transformer.h[attention_layer].attn.kept.weights.cast(DType.float32),)
    return out


def ConcatGraph(lm, attention_layer: int | None):
    """Step 11's model with the course's cache (step 07's F.concat): flat
    tensors in and out, the cache among them."""
    from max.experimental import nn

    class GPT2Graph(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, ids, positions, *past_flat):
            past = list(zip(past_flat[0::2], past_flat[1::2]))
            logits, present = self.lm(ids, past, positions)
            return _outputs(self.lm, logits, attention_layer, [t for kv in present for t in kv])

    return GPT2Graph()


def InPlaceGraph(lm, attention_layer: int | None):
    """Step 11's model over in-place cache buffers (model/kv_cache.py): ids,
    positions, the rows to write (start, end), the cached length as a shape
    (mark), 2 * n_layer buffers in; the logits (and one layer's
    probabilities) out. The buffers are written in place: no cache output."""
    from max.experimental import nn

    slots = [block.attn.slot for block in lm.transformer.h]

    class GPT2InPlaceGraph(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, ids, positions, start, end, mark, *buffers):
            for i, slot in enumerate(slots):
                slot.bind(buffers[2 * i], buffers[2 * i + 1], start, end, mark)
            logits, _ = self.lm(ids, [slot.cached() for slot in slots], positions)
            return _outputs(self.lm, logits, attention_layer)

    return GPT2InPlaceGraph()


def wrap(lm, options: BuildOptions):
    """The graph module around ``lm`` for ``options.cache``."""
    return (InPlaceGraph if options.cache == "in_place" else ConcatGraph)(lm, options.attention_layer)


def compile_graph(graph, config, options: BuildOptions, weights: dict, store):
    """Trace ``graph`` and compile it for ``options.placement`` with
    ``weights`` (saving its MEF through ``store``: model/saved_graphs.py)."""
    from max.dtype import DType
    from max.graph import TensorType

    placement = options.placement
    device = placement.max_device()
    ids_type = TensorType(DType.int64, ["batch", "seq"], device=device)
    positions_type = TensorType(DType.int64, ["scored"], device=device)
    if options.cache == "in_place":
        from max.driver import CPU
        from max.graph import BufferType

        host = TensorType(DType.int64, [], device=CPU())  # slice bounds live on the host
        buffer = BufferType(placement.max_dtype(), ["batch", config.n_head, "capacity", config.head_dim],
                            device=device)
        cache_types = [host, host, TensorType(DType.int8, ["past"], device=CPU())] + [buffer] * (2 * config.n_layer)
    else:
        kv = TensorType(placement.max_dtype(), ["batch", config.n_head, "past", config.head_dim], device=device)
        cache_types = [kv] * (2 * config.n_layer)
    start = time.perf_counter()
    try:
        compiled = graph.compile(ids_type, positions_type, *cache_types,
                                 weights=weights, name=store.name,
                                 session=store.session)
    except BaseException:
        store.discard()
        raise
    if not store.loaded:
        print(f"compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return compiled
