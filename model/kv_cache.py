"""The app's KV cache: buffers allocated once, written in place by the graph.

Why this sits beside step 07's ConcatCache: the course's cache keeps its keys
and values as values. Every step ``F.concat``s the cached keys and values
with the new ones into new tensors, which copies the whole cache for every
token. On GPT-2 124M a decode step then grew with every cached token, to
several times the q4_0 step itself at 896 tokens of context
(docs/decisions/0002-in-place-kv-cache.md). Here each layer's keys and values live in one buffer
[batch, n_head, capacity, head_dim], allocated once per generation and sized
for it (prompt plus new tokens, at most the context window). The graph
stores the new rows at [past, past + seq) (``F.buffer_store_slice``) and
reads [0, past + seq) back, so a step costs what its attention reads, not a
copy of the cache.

``InPlaceCache`` is the object step 07's forward calls, as it calls the
course's ConcatCache: ``update`` writes and reads the buffers, ``attend``
is the course cache's own (step 02's mask, then the layer's ``_attn``: the
solution's, or the learner's with ``--impl steps``). Only where the keys and
values are kept differs; the attention, c_attn to c_proj, is the course's
forward, unchanged.

``StaticCache`` is the same interface for a decode step that a GPU can
capture once and replay (model/runtime.py): its buffers are written and read
over their whole capacity, the cached length is a device value (``past``)
rather than a shape or a host scalar, and its ``attend`` hides the keys past
that length with a mask over the whole capacity before calling the layer's
``_attn``. Nothing in a call then depends on the length but the values the
kernels read, so one captured graph serves every later token of a batch
size.

``tests/test_kv_cache.py`` checks that all three give the same logits and
greedy tokens.

An attention op of its own over the buffers was tried and not kept (it gave
nothing measurable: the same record).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model.max_internals import tensor_value


class InPlaceCache:
    """One layer's buffers for the call being traced.

    ``keys``, ``values``: the layer's two buffers; ``start`` and ``end``:
    int64 scalars on the host, past and past + seq, the rows this call
    writes; ``mark``: an input whose length is past (shapes need it as a
    symbolic dimension); ``attend``: the course cache's (step 07's
    ``ConcatCache().attend``), which reads only its arguments.
    A plain object that MAX's module tree does not look inside."""

    def __init__(self, keys, values, start, end, mark, attend) -> None:
        self.keys, self.values, self.start, self.end, self.mark = keys, values, start, end, mark
        self.attend = attend

    @property
    def length(self):
        """The cached positions before this call (step 10 reads it for the positions)."""
        return self.mark.shape[0]

    def update(self, k, v):
        """Write the new rows k, v [batch, n_head, seq, head_dim] at [past,
        past + seq); return the cached and new keys and values, [0, past + seq)."""
        from max.experimental import functional as F

        seq = k.shape[2]
        start, end = tensor_value(self.start), tensor_value(self.end)
        rows = (slice(None), slice(None), (slice(start, end), seq), slice(None))
        F.buffer_store_slice(self.keys, k, rows)
        F.buffer_store_slice(self.values, v, rows)
        upto = (slice(None), slice(None), (slice(0, end), self.length + seq), slice(None))
        return self.keys[upto], self.values[upto]


class StaticCache:
    """One layer's buffers for a capture-safe call (a decode step replayed from a device graph).

    ``keys``, ``values``: the layer's two buffers [batch, n_head, capacity,
    head_dim]; ``past``: an int64 [1] device value, the positions cached before
    this call. ``update`` writes the new rows at [past, past + seq) by a select
    over the whole buffer (a slice store takes its bounds on the host, which a
    replay would not read again) and returns the whole buffer; ``attend`` masks
    every key after each query's position, the unwritten rows included. The
    course's ``_attn`` does the rest."""

    def __init__(self, keys, values, past) -> None:
        self.keys, self.values, self.past = keys, values, past

    @property
    def length(self):
        """The cached positions before this call, as a device value (model/graph.py's StaticGraph
        reads the positions' rows at it)."""
        return self.past

    def update(self, k, v):
        """Write k, v [batch, n_head, seq, head_dim] at rows [past, past + seq);
        return both buffers whole, [0, capacity)."""
        return self._written(self.keys, k), self._written(self.values, v)

    def _written(self, buffer, new):
        from max.dtype import DType
        from max.experimental import functional as F

        capacity, seq = buffer.shape[2], new.shape[2]
        old = buffer[:, :, :, :]  # the whole buffer, read before this call's store
        offset = F.arange(0, capacity, dtype=DType.int64, device=new.device) - self.past  # row - past
        last = F.max(F.arange(0, seq, dtype=DType.int64, device=new.device), axis=0)  # seq - 1, as a value
        inside = F.logical_and(F.greater_equal(offset, 0), F.greater_equal(last, offset))
        rows = F.gather(new, F.where(inside, offset, 0), axis=2)  # row r takes new[r - past]
        written = F.where(inside.reshape([1, 1, capacity, 1]), rows, old)
        F.buffer_store(buffer, written)
        return written

    def attend(self, q, k, v, attn):
        """``attn(q, k, v, mask)``: query i (at position past + i) sees keys
        0..past + i of the whole capacity, -inf elsewhere (in q's dtype)."""
        from max.dtype import DType
        from max.experimental import functional as F
        from max.experimental.tensor import Tensor

        seq, capacity = q.shape[2], k.shape[2]
        keys = F.arange(0, capacity, dtype=DType.int64, device=q.device).reshape([1, capacity])
        queries = (self.past + F.arange(0, seq, dtype=DType.int64, device=q.device)).reshape([seq, 1])
        hidden = F.greater(keys, queries)
        minus_inf = Tensor.full([], float("-inf"), dtype=q.dtype, device=q.device)
        return attn(q, k, v, F.where(hidden, minus_inf, Tensor.zeros([], dtype=q.dtype, device=q.device)))


@dataclass
class Cache:
    """A generation's cache: 2 * n_layer buffers and how many positions they hold.

    ``GPT2.step`` writes into the buffers and returns a new Cache with the new
    length; the one passed in is then spent (its buffers have moved on), and
    passing it again raises."""

    buffers: list = field(repr=False)
    length: int = 0
    spent: bool = False

    @property
    def batch(self) -> int:
        return int(self.buffers[0].shape[0])

    @property
    def capacity(self) -> int:
        """How many positions the buffers hold (sized by GPT2.empty_cache)."""
        return int(self.buffers[0].shape[2])
