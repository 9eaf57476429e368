"""The one model build: every caller gets its GPT-2 from ``load_gpt2``.

    gpt2 = load_gpt2("gpt2")                        # hub id or folder; device/dtype auto
    cache = gpt2.empty_cache(batch=1)
    logits, cache = gpt2.step(ids, cache)           # prefill: the whole prompt -> [batch, vocab]
    logits, cache = gpt2.step(next_ids, cache)      # decode: one token each   -> [batch, vocab]
    every = gpt2.forward_logits(ids)                # no cache, every position -> [batch, seq, vocab]

    amap = load_gpt2("gpt2", attention_layer=5)     # the same graph, plus one layer's probabilities
    probs, logits = amap.attention(ids)             # [batch, n_head, seq, seq], [batch, vocab]

From ``--model`` to tokens (generate, attention-map, the bench, the tests):

    weights/resolve.py    the hub id or folder -> a folder
    weights/config.py     config.json -> the course's GPT2Config (step 01)
    weights/checkpoint.py safetensors -> {name: float32 array}: Conv1D weights
                          transposed (saved once per checkpoint), buffers
                          dropped, shapes verified, lm_head tied to wte
    model/course.py       the course's classes: solutions/ or the learner's steps/
    build_lm (here)       GPT2LMHeadModel(config, linear, attention) under F.lazy():
                          linear is model/fast_linear.py's few-rows op for
                          float32 on the CPU (step 04's nn.Linear with
                          --linear course, and on a GPU), or model/quantize.py's
                          maker for q8_0 / q4_0 (this project's ops) and q6_k
                          (MAX's qmatmul); the ops take the CPU's kernel path
                          (model/cpu.py); attention is step 07's, or step 15's
                          where the attention map is asked for, made by
                          model/kv_cache.py to keep its cache in place
    model/quantize.py     quantize_state: blocks for exactly the quantized layers
                          (saved once per checkpoint)
    InPlaceGraph (here)   step 11's forward over the cache buffers
    compile               one graph, symbolic batch, sequence and cache lengths;
                          model/saved_graphs.py saves it as a MEF and drives
                          that directly on later starts (nothing traced)
    model/generate.py     prefill once, then one token per step; sampling.py picks
    model/engine_threads.py  after the first call on the CPU, MAX's background
                          threads to the lowest priority (``_after_execute``)

The graph takes ``ids`` [batch, seq], ``positions`` [k] (the positions whose
logits to return: the last one when generating, every one for
``forward_logits``; step 11's ``positions``) and the cache: the rows this
call writes (start, end), the cached length as a shape, and 2 * n_layer
buffers [batch, n_head, capacity, head_dim] that it writes in place. It
returns the logits [batch, k, vocab] and, when built with
``attention_layer``, that layer's probabilities. One compiled graph
prefills a prompt of any length and decodes, for the whole process.
``cache="concat"`` builds the course's own cache instead (step 07: the
cache goes in and comes out as tensors, concatenated every step); it is
kept to prove both give the same tokens (tests/test_kv_cache.py).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from model import saved_graphs
from model.course import IMPLS, Course, config_class, course
from model.device import Placement, choose
from model.fast_linear import LINEARS
from model.kv_cache import Cache, in_place
from weights import load_state, load_tokenizer, read_config, read_eos_token_ids, resolve_model

__all__ = ["GPT2", "IMPLS", "load_gpt2"]


@dataclass
class GPT2:
    """A loaded, compiled GPT-2 and what is needed to drive it."""

    config: object
    placement: Placement
    compiled: object = field(repr=False)
    compile_seconds: float
    tokenizer: object = field(default=None, repr=False)
    source: str = ""
    impl: str = "solutions"
    quantized_layers: int = 0  # Linear layers (LM head included) that run quantized
    attention_layer: int | None = None  # whose probabilities the graph also returns
    saved_graph: bool = False  # loaded from model/saved_graphs.py's MEF, not compiled
    eos_token_ids: tuple[int, ...] = ()  # the ids that end generation
    cache: str = "in_place"  # "in_place" (model/kv_cache.py) or "concat" (the course's step 07 way)

    def empty_cache(self, batch: int, length: int | None = None):
        """A cache holding nothing, for ``batch`` sequences of up to ``length``
        positions (default: the context window): in-place buffers
        (model/kv_cache.py) or, with ``cache="concat"``, n_layer (key, value)
        pairs of length 0 (the course's step 07 way). Both are the engine's
        driver buffers, as the graph takes them (``_run``)."""
        from max.driver import Buffer

        c = self.config
        if self.cache == "in_place":
            length = c.n_positions if length is None else length
            if not 0 < length <= c.n_positions:
                raise ValueError(f"a cache of {length} positions: the context window holds 1-{c.n_positions}")
            shape = (batch, c.n_head, length, c.head_dim)
            if self.placement.kind == "cpu":  # float32 there; numpy's zero pages cost no eager op
                return Cache([Buffer.from_numpy(np.zeros(shape, np.float32)) for _ in range(2 * c.n_layer)])
            return Cache([Buffer.zeros(shape, self.placement.max_dtype(), self.placement.max_device())
                          for _ in range(2 * c.n_layer)])
        empty = Buffer.zeros((batch, c.n_head, 0, c.head_dim), self.placement.max_dtype(), self.placement.max_device())
        return [empty] * (2 * c.n_layer)

    def step(self, ids: np.ndarray, cache) -> tuple[np.ndarray, object]:
        """Run ``ids`` [batch, seq] after the cached positions: the logits of
        the last position (float32 numpy [batch, vocab]) and the new cache, to
        pass to the next call (an in-place cache passed once is spent)."""
        ids = np.asarray(ids, dtype=np.int64)
        out, cache = self._run(ids, [ids.shape[1] - 1], cache)
        return self._host(out[0])[:, 0], cache

    def forward_logits(self, ids: np.ndarray) -> np.ndarray:
        """Every position's logits, without a cache: [batch, seq, vocab]."""
        ids = np.asarray(ids, dtype=np.int64)
        out, _ = self._run(ids, range(ids.shape[1]), self.empty_cache(*ids.shape))
        return self._host(out[0])

    def attention(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The attention probabilities of layer ``attention_layer`` ([batch,
        n_head, seq, seq], float32 numpy) and the last position's logits
        ([batch, vocab]), from one run without a cache."""
        if self.attention_layer is None:
            raise ValueError("this model was built without attention_layer; load_gpt2(..., attention_layer=N)")
        ids = np.asarray(ids, dtype=np.int64)
        out, _ = self._run(ids, [ids.shape[1] - 1], self.empty_cache(*ids.shape))
        return self._host(out[-1]), self._host(out[0])[:, 0]

    def _run(self, ids: np.ndarray, positions, cache) -> tuple[list, object]:
        """One graph call; returns its outputs (driver buffers) and the cache after it.

        The graph is driven through the engine's own ``Model.execute`` on
        driver buffers, not through MAX's Tensor-level call (which wraps each
        input and output in a Tensor and binds the call's signature): a q4_0
        decode step of GPT-2 124M took ~0.4 ms less (docs/journal.md, "Profile of a
        decode step")."""
        from max.driver import Buffer

        model = self.compiled.engine_model
        positions = self._buffer(np.asarray(list(positions), dtype=np.int64))
        ids_b = self._buffer(ids)
        if self.cache != "in_place":
            out = model.execute(ids_b, positions, *cache)
            self._after_execute()
            return out, out[1:1 + 2 * self.config.n_layer]
        if cache.spent:
            raise ValueError("this cache was already passed to step(); pass the cache step() returned")
        past, end = cache.length, cache.length + ids.shape[1]
        if end > cache.capacity:
            raise ValueError(f"{end} positions do not fit a cache of {cache.capacity} "
                             f"(empty_cache(batch, length) sizes it; the context window holds {self.config.n_positions})")
        if ids.shape[0] != cache.batch:
            raise ValueError(f"ids have batch {ids.shape[0]}, the cache {cache.batch}")
        # Host scalars: where this call writes; `mark` carries the cached length as a shape.
        host = [Buffer.from_numpy(np.array(v, dtype=np.int64)) for v in (past, end)]
        mark = Buffer.from_numpy(np.zeros(past, dtype=np.int8))
        out = model.execute(ids_b, positions, *host, mark, *cache.buffers)
        self._after_execute()
        cache.spent = True
        return out, Cache(cache.buffers, end)

    def _after_execute(self) -> None:
        """After the process's first graph call, on the CPU: MAX's background
        threads to the lowest priority (model/engine_threads.py: one of them
        wakes every 100 us and took ~10% of a decode step's time from the
        2 cores here)."""
        if self.placement.kind == "cpu":
            from model.engine_threads import quiet_background_threads

            quiet_background_threads()

    def _buffer(self, array: np.ndarray):
        """A host array as a driver buffer on the model's device."""
        from max.driver import Buffer

        b = Buffer.from_numpy(array)  # a view; a copy only where the array is not contiguous
        return b if self.placement.kind == "cpu" else b.to(self.placement.max_device())

    @staticmethod
    def _host(b) -> np.ndarray:
        """A graph output (a driver buffer) as float32 numpy on the host."""
        from max.driver import CPU
        from max.dtype import DType

        if b.dtype != DType.float32:  # bfloat16 probabilities on a GPU: cast there
            from max.experimental.tensor import Tensor

            b = Tensor(storage=b).cast(DType.float32).driver_tensor
        return (b if b.is_host else b.to(CPU())).to_numpy()


CACHES = ("in_place", "concat")


def load_gpt2(model: str | Path, device: str = "auto", dtype: str = "auto", impl: str = "solutions", *,
              attention_layer: int | None = None, cache: str = "in_place", linear: str = "custom",
              with_tokenizer: bool = True) -> GPT2:
    """The one build: resolve, read, verify, build, load and compile a GPT-2 checkpoint.

    ``model``: a hub id or a folder. ``device``/``dtype``: see model/device.py
    (q6_k / q4_0 build quantized Linear layers). ``impl``: "solutions" or
    "steps" (the learner's files). ``attention_layer``: also return that
    layer's attention probabilities (``GPT2.attention``). ``cache``:
    "in_place" (the app's, model/kv_cache.py) or "concat" (step 07's own
    way, kept to prove both give the same tokens). ``linear``: "custom"
    (the default; float32 on the CPU: model/fast_linear.py's Mojo kernel for
    few rows, decode ~1.17x faster; elsewhere it changes nothing) or "course"
    (step 04's nn.Linear everywhere, MAX's own matmul).

    Raises ``weights.WeightsError`` or ``model.device.DeviceError`` with a
    one-line message for anything the user can fix."""
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, not {cache!r}")
    if linear not in LINEARS:
        raise ValueError(f"linear must be one of {LINEARS}, not {linear!r}")
    placement = choose(device, dtype)
    folder = resolve_model(str(model))
    config = read_config(folder, config_class(impl))
    if attention_layer is not None and not 0 <= attention_layer < config.n_layer:
        raise ValueError(f"attention_layer {attention_layer}: the model has layers 0-{config.n_layer - 1}")
    tokenizer = load_tokenizer(folder, config) if with_tokenizer else None
    state = load_state(folder, config, saved_graphs.copies_folder())  # every shape verified before building
    kernels = uses_kernels(placement, linear)
    name = saved_graphs.graph_name(impl, config, placement,
                                   {"attention_layer": attention_layer, "cache": cache, "kernels": kernels})
    store = saved_graphs.store_for(name, placement.max_device(), direct=placement.dtype != "bfloat16")
    # The course's model is built to be traced, and to say which layers are
    # quantized; a saved graph driven directly needs neither (its facts say).
    specs = store.facts.get("quantized") if store.mef is not None else None
    lm = None
    if store.mef is None or (placement.quantization and specs is None):
        lm = build_lm(course(impl), config, placement, with_attention=attention_layer is not None, cache=cache,
                      linear=linear)
    if placement.quantization:
        from model.quantize import quantized_specs, saved_quantize_state

        specs = quantized_specs(lm) if lm is not None else specs
        state = saved_quantize_state(specs, state, folder)
    weights = {"lm." + key: array for key, array in state.items()}
    start = time.perf_counter()
    if store.mef is not None:  # run the saved graph as it is: no tracing
        compiled, quantized = store.run(weights), store.facts["quantized_layers"]
    else:  # trace, then compile (or find the saved graph that matches)
        if placement.kind != "cpu":
            lm.to(placement.max_device())
        graph = (InPlaceGraph if cache == "in_place" else ConcatGraph)(lm, attention_layer)
        compiled = _compile(graph, config, placement, weights, store, cache)
        quantized = _quantized_that_ran(lm)
        store.keep({"quantized_layers": quantized, "quantized": specs or {}})
    seconds = time.perf_counter() - start
    eos = read_eos_token_ids(folder) or ([tokenizer.eos_token_id] if tokenizer is not None else [])
    return GPT2(config, placement, compiled, seconds, tokenizer, str(folder), impl,
                quantized, attention_layer, store.loaded, tuple(eos), cache)


def uses_kernels(placement: Placement, linear: str = "custom") -> bool:
    """Whether the build calls model/kernels' custom ops: Q8_0 always (its
    only kernel), float32 on the CPU when ``linear="custom"``."""
    return placement.dtype == "q8_0" or (placement.kind == "cpu" and placement.dtype == "float32" and linear == "custom")


def build_lm(kit: Course, config, placement: Placement, with_attention: bool = False, cache: str = "in_place",
             linear: str = "custom"):
    """``GPT2LMHeadModel`` built lazily (no random init: the checkpoint fills
    it), its layers chosen here: quantized Linears for a quantized placement,
    model/fast_linear.py's for float32 on the CPU with ``linear="custom"``,
    step 15's attention (which keeps its probabilities) where asked, made to
    keep its cache in place (model/kv_cache.py) unless ``cache="concat"``. The
    dtype is always set explicitly: MAX's own default depends on the device
    (bfloat16 where an accelerator is present)."""
    from max.experimental import functional as F
    from max.experimental.tensor import default_dtype

    layers = {}
    if placement.quantization:
        from model.quantize import quantized_linear

        layers["linear"] = quantized_linear(placement.quantization)
    elif uses_kernels(placement, linear):
        from model.fast_linear import few_rows_linear

        layers["linear"] = few_rows_linear
    attention = kit.GPT2AttentionWithWeights if with_attention else kit.GPT2MultiHeadAttention
    if cache == "in_place":
        attention = in_place(attention, kit.causal_mask)
    if attention is not kit.GPT2MultiHeadAttention:
        layers["attention"] = attention
    with F.lazy(), default_dtype(placement.max_dtype()):
        return kit.GPT2LMHeadModel(config, **layers)


def _outputs(lm, logits, attention_layer: int | None, cache: list = ()) -> tuple:
    """A graph's outputs: the logits (float32), the cache tensors where the
    cache is not in place, and one layer's attention probabilities, kept by
    step 15's attention during the call (the other layers' are never
    materialised)."""
    from max.dtype import DType

    out = (logits.cast(DType.float32), *cache)
    if attention_layer is not None:
        out += (lm.transformer.h[attention_layer].attn.kept.weights,)
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


def _compile(graph, config, placement: Placement, weights: dict, store: saved_graphs.Store, cache: str):
    """Trace ``graph`` and compile it for ``placement`` with ``weights``
    (saving its MEF through ``store``)."""
    from max.dtype import DType
    from max.graph import TensorType

    device = placement.max_device()
    ids_type = TensorType(DType.int64, ["batch", "seq"], device=device)
    positions_type = TensorType(DType.int64, ["scored"], device=device)
    if cache == "in_place":
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
    if not store.loaded:  # a minute of silence looks like a hang: say what is happening
        print("compiling the model graph (about a minute the first time on 2 cores; saved for later runs) ...",
              file=sys.stderr, flush=True)
    try:
        compiled = graph.compile(ids_type, positions_type, *cache_types,
                                 weights=weights, auto_cast=placement.dtype == "bfloat16", name=store.name,
                                 session=store.session)
    except BaseException:
        store.discard()
        raise
    if not store.loaded:
        print(f"compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return compiled


def _quantized_that_ran(lm) -> int:
    """Quantized layers that the traced graph really calls (a learner's step
    may build one and not use it: it is not counted)."""
    from model.quantize import quantized_layers

    return sum(layer.traced.ran for _, layer in quantized_layers(lm))
