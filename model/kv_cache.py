"""The app's KV cache: buffers allocated once, written in place by the graph.

Why this sits beside step 07: the course's attention keeps the cache as
values. Every step ``F.concat``s the cached keys and values with the new ones
into new tensors, which copies the whole cache for every token. On GPT-2 124M a
decode step then grew with every cached token, to several times the q4_0
step itself at 896 tokens of context (docs/journal.md). Here each
layer's keys and values live in one buffer [batch, n_head, capacity,
head_dim], allocated once per generation and sized for it (prompt plus new
tokens, at most the context window). The graph stores the new rows at
[past, past + seq) (``F.buffer_store_slice``) and reads [0, past + seq) back,
so a step costs what its attention reads, not a copy of the cache.

The math is step 07's: the class below subclasses the course's own attention
(the solution's, or the learner's with ``--impl steps``) and reuses its
c_attn, ``_split_heads``, ``_attn``, ``_merge_heads``, c_proj and step 02's
causal mask. Only where the keys and values are kept differs.

``tests/test_kv_cache.py`` checks that both give the same logits and
greedy tokens.

An attention op of its own over the buffers was tried and not kept (it gave
nothing measurable): docs/journal.md, "Profile of a decode step".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model.max_internals import tensor_value


class Slot:
    """One layer's buffers and where the call being traced writes.

    A plain holder that MAX's module tree does not look inside (not a
    parameter). The graph wrapper binds it before it calls the model: the two
    buffers, ``start`` and ``end`` (int64 scalars on the host: past and past +
    seq, the rows this call writes) and ``mark`` (an input whose length is
    past: shapes need it as a symbolic dimension)."""

    keys = values = start = end = mark = None

    def bind(self, keys, values, start, end, mark) -> None:
        self.keys, self.values, self.start, self.end, self.mark = keys, values, start, end, mark

    @property
    def past(self):
        return self.mark.shape[0]

    def cached(self):
        """What the course's transformer is handed as this layer's past keys
        and values: a [1, 1, past, 1] view of ``mark``, not the buffers' rows.
        The transformer reads only their length (shape[2], for the position
        embeddings) and the attention reads the buffers itself (``store``).
        Why: MAX reads a buffer's rows into a new tensor, and a read nobody
        uses stays in the graph, and it cost a long-context decode step more
        than the step itself (docs/journal.md)."""
        view = self.mark.reshape([1, 1, self.past, 1])
        return view, view

    def store(self, k, v):
        """Write the new rows k, v [batch, n_head, seq, head_dim] at [past,
        past + seq); return the cached and new keys and values, [0, past + seq)."""
        from max.experimental import functional as F

        seq = k.shape[2]
        start, end = tensor_value(self.start), tensor_value(self.end)
        rows = (slice(None), slice(None), (slice(start, end), seq), slice(None))
        F.buffer_store_slice(self.keys, k, rows)
        F.buffer_store_slice(self.values, v, rows)
        upto = (slice(None), slice(None), (slice(0, end), self.past + seq), slice(None))
        return self.keys[upto], self.values[upto]


def in_place(attention_class, causal_mask):
    """``attention_class`` (step 07's, or step 15's which also keeps its
    probabilities) with its cache in this module's buffers."""
    from max.experimental import functional as F
    from max.experimental import nn

    class InPlaceAttention(attention_class):
        def __init__(self, config, linear=nn.Linear) -> None:
            super().__init__(config, linear)
            self.slot = Slot()

        def forward(self, x, past_key=None, past_value=None, **_):
            # Step 07's forward, with slot.store in place of the F.concat.
            q, k, v = F.split(self.c_attn(x), [self.n_embd, self.n_embd, self.n_embd], axis=-1)
            q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
            k, v = self.slot.store(k, v)
            seq = x.shape[1]
            mask = causal_mask(seq, k.shape[2] - seq, dtype=x.dtype, device=x.device)
            return self.c_proj(self._merge_heads(self._attn(q, k, v, mask))), k, v

    InPlaceAttention.__name__ = InPlaceAttention.__qualname__ = f"InPlace{attention_class.__name__}"
    return InPlaceAttention


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
