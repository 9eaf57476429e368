"""Checks for bonus step 13: multi-head attention in numpy."""

from __future__ import annotations

import numpy as np

from checker import maxrun
from checker import oracle_attention as oa
from checker.harness import Check, CheckFailed, StepContext, compare

USES_MAX = True  # the comparison with step 07 runs MAX

HINT_SCALE = "divide the scores by sqrt(d_h), the head width"
HINT_SCALE_D = "the scale is 1 / sqrt(d_h) (one head's width), not 1 / sqrt(D)"
HINT_AXIS = "softmax over the last axis (the keys): each query's weights sum to 1"
HINT_SPLIT = ("split with reshape (T, h, d_h) then transpose to (h, T, d_h); "
              "a reshape straight to (h, T, d_h) mixes positions")
HINT_MERGE = "merge with transpose (h, T, d_h) -> (T, h, d_h) first, then reshape to (T, D)"
EXAMPLE = np.array([[0.7311, 0.5], [0.5, 0.7311]], dtype=np.float32)


def _mistakes(Q, K, V, h) -> dict[str, np.ndarray]:
    return {
        HINT_SCALE: oa.multi_head_attention(Q, K, V, h, scale=1.0),
        HINT_SCALE_D: oa.multi_head_attention(Q, K, V, h, scale=1 / np.sqrt(Q.shape[-1])),
        HINT_AXIS: oa.multi_head_attention(Q, K, V, h, softmax_axis=-2),
        HINT_SPLIT: oa.multi_head_attention(Q, K, V, h, split_transpose=False),
        HINT_MERGE: oa.multi_head_attention(Q, K, V, h, merge_transpose=False),
    }


def _mha(ctx: StepContext, Q, K, V, h) -> np.ndarray:
    got = ctx.call(ctx.learner.multi_head_attention, Q, K, V, h, what="multi_head_attention")
    return np.asarray(got, dtype=np.float32)


def check_softmax(ctx: StepContext) -> None:
    x = np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, 1001.0]])
    got = np.asarray(ctx.call(ctx.learner.softmax, x, what="softmax"))
    if not np.isfinite(got).all():
        raise CheckFailed("softmax([1000, 1000, 1001]) overflowed to inf/NaN",
                          "subtract each row's max before np.exp: softmax(x) = softmax(x - max)")
    e = np.exp(x - x.max(-1, keepdims=True))
    compare(got, e / e.sum(-1, keepdims=True), "softmax of two rows", "np.exp(x - max) / its sum along the axis")


def check_worked_example(ctx: StepContext) -> None:
    I2 = np.eye(2)
    got = _mha(ctx, I2, I2, I2, 2)
    if got.shape == (2, 2) and np.allclose(got, I2, atol=1e-3):
        raise CheckFailed("multi_head_attention(I, I, I, 2) gave the identity",
                          "softmax never gives exact 0/1 weights: scores [1, 0] give [0.7311, 0.2689]")
    expected = oa.multi_head_attention(I2, I2, I2, 2)  # EXAMPLE, unrounded
    compare(got, expected, f"multi_head_attention(I, I, I, 2) (expected {EXAMPLE.tolist()})",
            "work the example at the top of the step by hand", lambda: _mistakes(I2, I2, I2, 2))


def check_matches_step_07(ctx: StepContext) -> None:
    # Step 07's MAX _attn on the same heads, with a mask of zeros (no masking).
    from solutions.solution_01 import GPT2Config
    from solutions.solution_07 import GPT2MultiHeadAttention

    rng = np.random.default_rng(13)
    for t_q, t_k, d, h in ((5, 5, 12, 3), (1, 7, 16, 4), (9, 4, 8, 1)):
        Q, K, V = (rng.standard_normal((t, d)).astype(np.float32) for t in (t_q, t_k, t_k))
        got = _mha(ctx, Q, K, V, h)
        attention = maxrun.build(GPT2MultiHeadAttention, GPT2Config(vocab_size=8, n_positions=16, n_embd=d,
                                                                     n_layer=1, n_head=h))
        heads = [np.ascontiguousarray(m.reshape(1, len(m), h, d // h).transpose(0, 2, 1, 3)) for m in (Q, K, V)]
        mask = np.zeros((t_q, t_k), np.float32)
        out = maxrun.lazily(attention._attn, *map(maxrun.tensor, (*heads, mask)), what="step 07 _attn")
        expected = out.transpose(0, 2, 1, 3).reshape(t_q, d)
        compare(got, expected, f"Q ({t_q}, {d}), K/V ({t_k}, {d}), {h} heads, against step 07's _attn",
                "per head softmax(q k^T / sqrt(d_h)) v, heads concatenated", lambda: _mistakes(Q, K, V, h))


def check_bad_heads(ctx: StepContext) -> None:
    Q = np.ones((3, 10))
    try:
        ctx.learner.multi_head_attention(Q, Q, Q, 4)
    except ValueError as exc:
        if "4" in str(exc) and "10" in str(exc):
            return
        raise CheckFailed(f"the ValueError says {str(exc)!r}", "name both numbers: n_heads (4) and D (10)") from None
    raise CheckFailed("multi_head_attention(Q of width 10, n_heads=4) did not raise ValueError",
                      "check D % n_heads == 0 first and raise ValueError(f'n_heads ({n_heads}) must divide D ({D})')")


CHECKS = [
    Check("softmax is stable for large inputs", check_softmax, "np.exp(x - x.max(axis, keepdims=True))"),
    Check("the worked example: Q = K = V = I2, 2 heads", check_worked_example,
          "per head softmax(q k^T / sqrt(d_h)) v"),
    Check("matches step 07's MAX _attn (self- and cross-attention, 1-4 heads)", check_matches_step_07,
          "split heads, attend per head, concatenate"),
    Check("n_heads that does not divide D raises ValueError", check_bad_heads, "raise ValueError naming both"),
]
