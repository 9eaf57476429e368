"""Step 07: multi-head self-attention, ``GPT2MultiHeadAttention``.

What
    The layer that lets each position read from earlier positions:

        c_attn:  one Linear n_embd -> 3 * n_embd, then split into Q, K, V (in that order)
        _split_heads:  [batch, seq, n_embd] -> [batch, n_head, seq, head_dim]
        attention_weights:  softmax(Q K^T / sqrt(head_dim) + mask), per head
        _attn:   those weights times V
        _merge_heads:  [batch, n_head, seq, head_dim] -> [batch, seq, n_embd]
        c_proj:  Linear n_embd -> n_embd

Why
    Each head asks its own question (query) of every earlier position (keys)
    and takes a weighted average of their answers (values). GPT-2 computes Q, K
    and V with one combined matrix, ``c_attn``; its checkpoints store it that
    way, so the names and the Q, K, V order must match to load them.

    ``forward(x, past_key, past_value)`` also returns the keys and values it
    used (cached ones first, then the new ones). A KV cache (the app) keeps
    them, so that the next token computes only its own Q, K, V: the mask of
    step 02 with ``past_len`` makes the new rows see the cached positions.

The math, per head, with d = head_dim
    scores  = Q K^T / sqrt(d)                 [seq, past + seq]
    weights = softmax(scores + mask)          over the last axis (the keys)
    out     = weights V                       [seq, d]

    The scale keeps the dot products (a sum of d terms) from growing with d;
    without it softmax saturates. The mask goes in *before* the softmax, so
    hidden positions get weight exp(-inf) = 0 and each row still sums to 1.

Shapes of the head split (b = batch, t = seq, h = n_head, d = head_dim)
    [b, t, h*d] --reshape--> [b, t, h, d] --transpose(1, 2)--> [b, h, t, d]
    Merging undoes it in reverse order: transpose back, then reshape.

Useful MAX calls
    ``linear(n_in, n_out)`` makes a Linear layer (``nn.Linear`` by default; see
    step 04), ``F.split(x, [n, n, n], axis=-1)``, ``x.reshape([...])``,
    ``x.transpose(a, b)``, ``q @ k.transpose(-1, -2)``, ``F.softmax(x, axis=-1)``,
    ``F.concat([a, b], axis=2)``; ``x.shape[1]`` is a dimension you can reuse.

Coming from PyTorch? docs/pytorch-to-max.md#axis-not-dim, docs/pytorch-to-max.md#masking-with--inf,
docs/pytorch-to-max.md#linear-layers

Check your work with ``pixi run s07`` (without pixi: ``python3.13 tasks.py s07``).
"""

import math

from max.experimental import functional as F
from max.experimental import nn
from max.experimental.tensor import Tensor

from solutions.solution_01 import GPT2Config
from solutions.solution_02 import causal_mask


class GPT2MultiHeadAttention(nn.Module):
    """Causal multi-head self-attention with GPT-2's combined ``c_attn``."""

    def __init__(self, config: GPT2Config, linear=nn.Linear) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.head_dim = config.head_dim  # step 01
        # Made by ``linear`` (see step 04): c_attn: n_embd -> 3 * n_embd (Q, K
        # and V at once); c_proj: n_embd -> n_embd.
        # BEGIN SOLUTION
        self.c_attn = linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = linear(config.n_embd, config.n_embd)
        # END SOLUTION

    def _split_heads(self, x: Tensor) -> Tensor:
        """[batch, seq, n_embd] -> [batch, n_head, seq, head_dim]"""
        # BEGIN SOLUTION
        batch, seq = x.shape[0], x.shape[1]
        return x.reshape([batch, seq, self.n_head, self.head_dim]).transpose(1, 2)
        # END SOLUTION

    def _merge_heads(self, x: Tensor) -> Tensor:
        """[batch, n_head, seq, head_dim] -> [batch, seq, n_embd]"""
        # BEGIN SOLUTION
        batch, seq = x.shape[0], x.shape[2]
        return x.transpose(1, 2).reshape([batch, seq, self.n_embd])
        # END SOLUTION

    def attention_weights(self, q: Tensor, k: Tensor, mask: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(head_dim) + mask) over the keys: [batch, n_head, seq, past + seq]."""
        # BEGIN SOLUTION
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        return F.softmax(scores + mask, axis=-1)
        # END SOLUTION

    def _attn(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """The attention weights times v, for every batch and head."""
        # BEGIN SOLUTION
        return self.attention_weights(q, k, mask) @ v
        # END SOLUTION

    def forward(
        self, x: Tensor, past_key: Tensor | None = None, past_value: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Returns (output [batch, seq, n_embd], keys, values), where keys and
        values [batch, n_head, past + seq, head_dim] include the cached ones."""
        # 1. c_attn, then split the last axis into Q, K, V (n_embd each, in that order).
        # 2. Split each into heads.
        # 3. With a cache, put the cached keys/values before the new ones (axis 2).
        # 4. The causal mask for seq new rows after past cached positions.
        # 5. Attention, merge the heads, c_proj.
        # BEGIN SOLUTION
        q, k, v = F.split(self.c_attn(x), [self.n_embd, self.n_embd, self.n_embd], axis=-1)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        if past_key is not None:
            k = F.concat([past_key, k], axis=2)
            v = F.concat([past_value, v], axis=2)
        seq = x.shape[1]
        mask = causal_mask(seq, k.shape[2] - seq, dtype=x.dtype, device=x.device)
        out = self._merge_heads(self._attn(q, k, v, mask))
        return self.c_proj(out), k, v
        # END SOLUTION
