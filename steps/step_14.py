"""Bonus step 14: the post-LN attention block of "Attention Is All You Need".

What
    ``post_ln_attention_block(x, w_q, w_k, w_v, w_o, num_heads)`` for x of
    shape (N, T, d_model) and four (d_model, d_model) matrices, as in the
    2017 paper's encoder (no mask, no biases, a layer norm with no learned
    scale or shift, eps 1e-5):

        Q, K, V = x W_q, x W_k, x W_v                 (x @ W: rows are inputs)
        heads   = softmax(Q_i K_i^T / sqrt(d_h)) V_i  for each head i
        out     = LayerNorm(x + concat(heads) W_o)    normalized over d_model

Why post-LN and pre-LN differ
    The 2017 Transformer normalizes *after* adding the residual:
    ``LayerNorm(x + Sublayer(x))``. GPT-2 (step 08) normalizes *before* the
    sublayer and adds the raw input: ``x + Sublayer(LayerNorm(x))``. In
    pre-LN the residual stream is never normalized, so a gradient has an
    untouched path from the loss to the first layer; that is why GPT-2 and
    most later models train deep stacks without the careful learning-rate
    warm-up post-LN needs. (GPT-2 then adds one final ``ln_f``, step 10.)

Errors
    ``num_heads`` must divide d_model: raise ``ValueError`` naming both.

Useful MAX calls
    ``x @ w``, ``t.reshape([...])``, ``t.transpose(a, b)``,
    ``F.softmax(t, axis=-1)``, ``t.mean(axis=-1)`` (keeps the axis, size 1),
    ``F.rsqrt(t)``; ``int(x.shape[-1])`` is a static width.

Check your work with ``pixi run s14`` (without pixi: ``python3.13 tasks.py s14``).
"""

import math

from max.experimental import functional as F
from max.experimental.tensor import Tensor

EPS = 1e-5


def normalize(x: Tensor, eps: float = EPS) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the last axis (no gamma, no beta)."""
    raise NotImplementedError("TODO(step 14): replace this line with your code")


def post_ln_attention_block(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, w_o: Tensor,
                            num_heads: int) -> Tensor:
    """LayerNorm(x + MultiHead(x) W_o), x (N, T, d_model) -> (N, T, d_model)."""
    # 1. Check that num_heads divides d_model (ValueError otherwise).
    # 2. Q, K, V = x @ w_q, x @ w_k, x @ w_v; split each into heads
    #    (N, T, d_model) -> (N, h, T, d_h).
    # 3. softmax(Q K^T / sqrt(d_h)) V per head; merge the heads back.
    # 4. Project with w_o, add x, normalize.
    raise NotImplementedError("TODO(step 14): replace this line with your code")
