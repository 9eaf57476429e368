"""A compiled GPT-2 at run time: its cache, one graph call, the results on the host.

    cache = gpt2.empty_cache(batch=1)
    logits, cache = gpt2.step(ids, cache)           # prefill: the whole prompt -> [batch, vocab]
    logits, cache = gpt2.step(next_ids, cache)      # decode: one token each   -> [batch, vocab]
    every = gpt2.forward_logits(ids)                # no cache, every position -> [batch, seq, vocab]
    probs, logits = gpt2.attention(ids)             # built with attention_layer: [batch, n_head, seq, seq]

``load_gpt2`` (model/gpt2.py) makes it; model/generate.py drives it.

With the static cache on a GPU (``BuildOptions.replays``), a decode step (one
token per sequence) is not a plain call: the first one of each batch size and
cache capacity is captured as a device graph (MAX's ``Model.capture``) over
input buffers kept for it (the token ids, the cached length, the cache), and
every later one copies its ids and length into those buffers and replays the
graph (``Model.replay``): the card runs the step's kernels without the host
launching each. The cache buffers of a capacity are therefore allocated once
per batch size and handed to each new generation of that shape (their rows
past its length are masked: model/kv_cache.py's StaticCache).
``GPT2_MAX_VERIFY_REPLAY=1`` has MAX check each capture against a plain call
(``Model.debug_verify_replay``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from model.device import Placement
from model.kv_cache import Cache
from model.options import BuildOptions

VERIFY_REPLAY_ENV = "GPT2_MAX_VERIFY_REPLAY"
# The static cache's capacity is the generation's rounded up to a multiple of this (at most the
# context window), so that generations of nearby lengths replay one captured graph.
STATIC_CAPACITY_STEP = 64


@dataclass
class Captured:
    """A static cache's buffers and the decode step's other inputs, kept for
    one (batch, capacity): what a captured device graph reads and writes.
    ``owner``: the Cache they were last handed to; ``outputs``: the
    capture's (a replay writes its logits there), None until captured."""

    buffers: list
    ids: object
    positions: object
    past: object
    owner: object = None
    outputs: list | None = None


@dataclass
class GPT2:
    """A loaded, compiled GPT-2 and what is needed to drive it."""

    config: object
    options: BuildOptions
    compiled: object = field(repr=False)
    compile_seconds: float
    tokenizer: object = field(default=None, repr=False)
    source: str = ""
    quantized_layers: int = 0  # Linear layers (LM head included) that run quantized
    saved_graph: bool = False  # loaded from model/saved_graphs.py's MEF, not compiled
    eos_token_ids: tuple[int, ...] = ()  # the ids that end generation
    weight_bytes: int = 0  # the arrays handed to the graph, each counted once (the tied head is wte)
    captured: dict = field(default_factory=dict, repr=False)  # (batch, capacity) -> Captured (static cache)

    @property
    def placement(self) -> Placement:
        return self.options.placement

    @property
    def impl(self) -> str:
        return self.options.impl

    @property
    def attention_layer(self) -> int | None:
        """Whose probabilities the graph also returns."""
        return self.options.attention_layer

    @property
    def cache(self) -> str:
        """"in_place" or "static" (model/kv_cache.py), or "concat" (the course's step 07 way)."""
        return self.options.kv_cache

    def empty_cache(self, batch: int, length: int | None = None):
        """A cache holding nothing, for ``batch`` sequences of up to ``length``
        positions (default: the context window): in-place buffers
        (model/kv_cache.py) or, with ``cache="concat"``, n_layer (key, value)
        pairs of length 0 (the course's step 07 way). Both are the engine's
        driver buffers, as the graph takes them (``_run``)."""
        from max.driver import Buffer

        c = self.config
        if self.cache != "concat":
            length = c.n_positions if length is None else length
            if not 0 < length <= c.n_positions:
                raise ValueError(f"a cache of {length} positions: the context window holds 1-{c.n_positions}")
            if self.cache == "static":
                return self._static_cache(batch, length)
            shape = (batch, c.n_head, length, c.head_dim)
            if self.placement.kind == "cpu":  # float32 there; numpy's zero pages cost no eager op
                return Cache([Buffer.from_numpy(np.zeros(shape, np.float32)) for _ in range(2 * c.n_layer)])
            return Cache([Buffer.zeros(shape, self.placement.max_dtype(), self.placement.max_device())
                          for _ in range(2 * c.n_layer)])
        empty = Buffer.zeros((batch, c.n_head, 0, c.head_dim), self.placement.max_dtype(), self.placement.max_device())
        return [empty] * (2 * c.n_layer)

    def _static_cache(self, batch: int, length: int) -> Cache:
        """A static cache of at least ``length`` positions: the buffers kept
        for its (batch, capacity), handed to this new cache (the one they were
        handed to before is refused from now on: its rows would be overwritten)."""
        from max.driver import Buffer

        c, p = self.config, self.placement
        capacity = min(-(-length // STATIC_CAPACITY_STEP) * STATIC_CAPACITY_STEP, c.n_positions)
        kept = self.captured.get((batch, capacity))
        if kept is None:
            shape = (batch, c.n_head, capacity, c.head_dim)
            kept = self.captured[batch, capacity] = Captured(
                [Buffer.zeros(shape, p.max_dtype(), p.max_device()) for _ in range(2 * c.n_layer)],
                self._buffer(np.zeros((batch, 1), np.int64)), self._buffer(np.zeros(1, np.int64)),
                self._buffer(np.zeros(1, np.int64)))
        kept.owner = Cache(kept.buffers)
        return kept.owner

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
        input and output in a Tensor and binds the call's signature), which cost
        a decode step measurably in the profile (``python -m bench.profile_decode``)."""
        from max.driver import Buffer

        model = self.compiled.engine_model
        positions = np.asarray(list(positions), dtype=np.int64)
        if self.cache == "concat":
            out = model.execute(self._buffer(ids), self._buffer(positions), *cache)
            self._after_execute()
            return out, out[1:1 + 2 * self.config.n_layer]
        if cache.spent:
            raise ValueError("this cache was already passed to step(); pass the cache step() returned")
        kept = self.captured.get((cache.batch, cache.capacity)) if self.cache == "static" else None
        if kept is not None and kept.owner is not cache:
            raise ValueError("this cache's buffers were handed to a newer cache of the same shape "
                             "(empty_cache); pass that one")
        past, end = cache.length, cache.length + ids.shape[1]
        if end > cache.capacity:
            raise ValueError(f"{end} positions do not fit a cache of {cache.capacity} "
                             f"(empty_cache(batch, length) sizes it; the context window holds "
                             f"{self.config.n_positions})")
        if ids.shape[0] != cache.batch:
            raise ValueError(f"ids have batch {ids.shape[0]}, the cache {cache.batch}")
        if kept is not None and ids.shape[1] == 1 and self.options.replays:
            out = self._replayed(ids, past, kept, cache)
        elif kept is not None:
            out = model.execute(self._buffer(ids), self._buffer(positions),
                                self._buffer(np.array([past], dtype=np.int64)), *cache.buffers)
        else:
            # Host scalars: where this call writes; `mark` carries the cached length as a shape.
            host = [Buffer.from_numpy(np.array(v, dtype=np.int64)) for v in (past, end)]
            mark = Buffer.from_numpy(np.zeros(past, dtype=np.int8))
            out = model.execute(self._buffer(ids), self._buffer(positions), *host, mark, *cache.buffers)
        self._after_execute()
        cache.spent = True
        after = Cache(cache.buffers, end)
        if kept is not None:
            kept.owner = after
        return out, after

    def _replayed(self, ids: np.ndarray, past: int, kept: Captured, cache: Cache) -> list:
        """A decode step replayed from the device graph captured for this
        batch and capacity (captured at its first step), its ids and cached
        length copied into the buffers the graph reads; its outputs are the
        capture's, written again by each replay."""
        from max.driver import Buffer

        model = self.compiled.engine_model
        kept.ids.inplace_copy_from(Buffer.from_numpy(ids))
        kept.past.inplace_copy_from(Buffer.from_numpy(np.array([past], dtype=np.int64)))
        inputs = (kept.ids, kept.positions, kept.past, *kept.buffers)
        key = graph_key(cache.batch, cache.capacity)
        if kept.outputs is None:
            kept.outputs = model.capture(key, *inputs)
            if os.environ.get(VERIFY_REPLAY_ENV) == "1":
                model.debug_verify_replay(key, *inputs)
        model.replay(key, *inputs)  # after a capture too: whether capturing ran the step is MAX's to say
        return kept.outputs

    def _after_execute(self) -> None:
        """After the process's first graph call, on the CPU: MAX's background
        threads to the lowest priority (model/engine_threads.py: one of them
        wakes in a tight loop and takes cycles from the threads reading the
        weights; docs/decisions/0007-background-threads-nice-19.md)."""
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
        """A graph output (a driver buffer, float32: model/graph.py's _outputs) as numpy on the host."""
        from max.driver import CPU

        return (b if b.is_host else b.to(CPU())).to_numpy()


def graph_key(batch: int, capacity: int) -> int:
    """The key a captured decode step is kept under by MAX (an unsigned 64-bit int)."""
    return batch << 32 | capacity
