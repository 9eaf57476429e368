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

The cache: an object the layer calls
    Generating one token at a time, the keys and values of the earlier
    positions never change, so a KV cache keeps them and each new token
    computes only its own Q, K, V. ``forward(x, cache)`` hands its new keys
    and values to the cache and lets the cache attend (as Hugging Face's
    ``Cache.update`` does):

        k, v = cache.update(k, v)                   # the cached ones first, then the new ones
        out = cache.attend(q, k, v, self._attn)     # _attn with the mask the cache knows

    You write the course's cache, ``ConcatCache``:

    * ``update(k, v)`` puts the new keys and values after the cached ones
      (``F.concat``, axis 2), keeps the result and returns it.
      ``cache.length`` counts what the cache holds: before ``update`` the
      earlier positions (past), after it those and the new rows (past + seq).
    * ``attend(q, k, v, attn)`` runs after ``update``: its k holds the
      cached keys and the new ones. It builds step 02's mask from its
      arguments alone: seq = ``q.shape[2]`` new rows after
      ``past_len = k.shape[2] - seq`` earlier keys (not ``self.length``,
      which by then counts the new rows too), in q's dtype and on q's device,
      since the mask is added to the scores:
      ``causal_mask(seq, past_len, dtype=q.dtype, device=q.device)``; then it
      returns ``attn(q, k, v, mask)``.

    Which of your code runs where. The checks run all of it. The app
    (``python -m model --impl steps``) keeps each layer's keys and values in
    buffers allocated once and written in place (model/kv_cache.py), so its
    cache has its own ``update`` and ``length``; it runs your forward, your
    ``ConcatCache.attend`` and, through it, your ``_attn``. The server
    (``python -m serve --impl steps``) writes into the serving engine's pages
    and attends with its flash-attention kernel (serve/network.py), which
    alone knows where each request of a batch starts; it runs your forward
    (c_attn, the head split and merge, c_proj) and neither your cache nor
    your ``_attn``.

The math, per head, with d = head_dim
    scores  = Q K^T / sqrt(d)                 [seq, past + seq]
    weights = softmax(scores + mask)          over the last axis (the keys)
    out     = weights V                       [seq, d]

    then for the layer: merge the heads ([h, seq, d] -> [seq, h*d = n_embd])
    and project them with c_proj, which mixes what the heads found:
    y       = merged W_proj + b_proj          [seq, n_embd]

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
    ``cache.length``: how many positions a cache holds (0 when empty).

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


class ConcatCache:
    """The course's KV cache for one layer: the keys and values seen so far,
    kept as tensors [batch, n_head, positions, head_dim] (None while empty).
    A plain object, not a Module: MAX would take Tensor attributes of a
    Module for parameters."""

    def __init__(self, keys: Tensor | None = None, values: Tensor | None = None) -> None:
        self.keys, self.values = keys, values

    @property
    def length(self):
        """How many positions are cached: 0, or the keys' axis 2."""
        return 0 if self.keys is None else self.keys.shape[2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Put this call's k, v [batch, n_head, seq, head_dim] after the cached
        ones (axis 2), keep the result, and return it."""
        # BEGIN SOLUTION
        if self.keys is not None:
            k = F.concat([self.keys, k], axis=2)
            v = F.concat([self.values, v], axis=2)
        self.keys, self.values = k, v
        return k, v
        # END SOLUTION

    def attend(self, q: Tensor, k: Tensor, v: Tensor, attn) -> Tensor:
        """``attn(q, k, v, mask)`` with step 02's causal mask, in q's dtype and
        on q's device, for q's seq rows after the k.shape[2] - seq earlier keys."""
        # BEGIN SOLUTION
        seq = q.shape[2]
        mask = causal_mask(seq, k.shape[2] - seq, dtype=q.dtype, device=q.device)
        return attn(q, k, v, mask)
        # END SOLUTION


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

    def forward(self, x: Tensor, cache=None) -> Tensor:
        """x [batch, seq, n_embd] -> [batch, seq, n_embd]. ``cache`` keeps this
        layer's keys and values from call to call (a ConcatCache, or the app's
        or the server's); None: a new ConcatCache, kept by nobody."""
        # 1. c_attn, then split the last axis into Q, K, V (n_embd each, in that order).
        # 2. Split each into heads.
        # 3. Hand k, v to the cache (cache.update): back come the cached ones and the new ones.
        # 4. Let the cache attend with your _attn (cache.attend), merge the heads, c_proj.
        # BEGIN SOLUTION
        q, k, v = F.split(self.c_attn(x), [self.n_embd, self.n_embd, self.n_embd], axis=-1)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        cache = ConcatCache() if cache is None else cache
        k, v = cache.update(k, v)
        return self.c_proj(self._merge_heads(cache.attend(q, k, v, self._attn)))
        # END SOLUTION
