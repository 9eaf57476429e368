"""Bonus step 16: causal self-attention with rotary position embeddings (RoPE).

What
    ``RotaryCausalSelfAttention(d_model, n_heads)``: separate ``q_proj``,
    ``k_proj``, ``v_proj`` and ``out_proj`` (Linear d_model -> d_model, no
    bias, as in LLaMA), RoPE applied to q and k in every head, and the causal
    mask of step 02. ``forward(x, positions)`` takes x (batch, seq, d_model)
    and the absolute position of each of the seq tokens, int64 (seq,), e.g.
    ``[100, 101, ...]`` for a chunk that starts at position 100.

Learned positions (GPT-2) against rotary positions
    GPT-2 *adds* a learned vector per position to the token embedding
    (``wpe``, step 06): 1024 rows, so it knows no position beyond 1024, and
    position mixes into everything downstream. RoPE adds nothing: it
    *rotates* each query and key by an angle proportional to its position.
    The dot product of a query at position m and a key at position n then
    depends only on m - n, so attention sees relative distance, there is no
    table to outgrow, and values carry no position at all (v is not rotated).

The math, per head of width d (even), with theta = 10000
    inv_freq[i] = theta ** (-2i / d)                    for i < d/2
    angle[p, i] = p * inv_freq[i];  cos, sin = cos(angle), sin(angle)
    both repeated to width d: [c_0 .. c_{d/2-1}, c_0 .. c_{d/2-1}]
    rotate_half(x) = concat(-x[d/2:], x[:d/2])
    rope(x) = x * cos + rotate_half(x) * sin
    This pairs dimension i with i + d/2 (the "rotate half" layout of GPT-NeoX
    and Hugging Face's LLaMA; Meta's original pairs neighbours 2i, 2i+1; the
    two differ by a fixed permutation of q/k's dimensions).

Useful MAX calls
    ``Tensor(numpy_array, dtype=..., device=...)`` or arithmetic on ``positions.cast(...)``,
    ``F.cos``, ``F.sin``, ``F.concat``, ``F.split``; broadcasting
    [seq, d] against [batch, heads, seq, d] works like numpy.

Coming from PyTorch? docs/pytorch-to-max.md#axis-not-dim, docs/pytorch-to-max.md#masking-with--inf

Check your work with ``pixi run s16`` (without pixi: ``python3.13 tasks.py s16``).
"""

import math

import numpy as np
from max.dtype import DType
from max.experimental import functional as F
from max.experimental import nn
from max.experimental.tensor import Tensor

from steps.step_02 import causal_mask

THETA = 10000.0


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float = THETA) -> tuple[Tensor, Tensor]:
    """cos and sin of every position's angles, each [seq, head_dim]."""
    raise NotImplementedError("TODO(step 16): replace this line with your code")


def rotate_half(x: Tensor) -> Tensor:
    """[..., d] -> concat(-second half, first half)."""
    raise NotImplementedError("TODO(step 16): replace this line with your code")


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [batch, heads, seq, d] by its positions' angles."""
    raise NotImplementedError("TODO(step 16): replace this line with your code")


class RotaryCausalSelfAttention(nn.Module):
    """Causal multi-head self-attention with RoPE on q and k."""

    def __init__(self, d_model: int, n_heads: int, theta: float = THETA) -> None:
        super().__init__()
        if d_model % n_heads != 0 or (d_model // n_heads) % 2 != 0:
            raise ValueError(f"n_heads ({n_heads}) must divide d_model ({d_model}) into an even head width")
        self.n_heads, self.d_model, self.theta = n_heads, d_model, theta
        self.head_dim = d_model // n_heads
        raise NotImplementedError("TODO(step 16): replace this line with your code")

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, seq = x.shape[0], x.shape[1]
        return x.reshape([batch, seq, self.n_heads, self.head_dim]).transpose(1, 2)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x [batch, seq, d_model], positions int64 [seq] -> [batch, seq, d_model]."""
        # 1. Project to q, k, v and split each into heads.
        # 2. Rotate q and k (not v) by their positions.
        # 3. Causal softmax(q k^T / sqrt(head_dim)) v, merge heads, out_proj.
        raise NotImplementedError("TODO(step 16): replace this line with your code")
