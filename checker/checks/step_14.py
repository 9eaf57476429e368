"""Checks for bonus step 14: the post-LN attention block (2017)."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker import oracle_attention as oa
from checker.harness import Check, CheckFailed, StepContext, compare

USES_MAX = True
D_MODEL, HEADS = 24, 4

HINT_PRE_LN = "this block is post-LN: LayerNorm(x + MultiHead(x) W_o); yours is GPT-2's pre-LN x + MultiHead(LN(x)) W_o"
HINT_RESIDUAL = "add x before normalizing: LayerNorm(x + MultiHead(x) W_o)"
HINT_TRANSPOSED = "project with x @ w (rows of w are input features), not x @ w.T"
HINT_BESSEL = "the layer norm's variance divides by d_model (population variance), not d_model - 1"
HINT_EPS_SIGN = "add eps to the variance, sqrt(var + eps), not subtract it"
HINT_SCALE = "divide the scores by sqrt(d_h) = sqrt(d_model / num_heads)"
HINT_SCALE_D = "the scale is 1 / sqrt(d_h), one head's width, not 1 / sqrt(d_model)"


def _weights(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((D_MODEL, D_MODEL)) / np.sqrt(D_MODEL)).astype(np.float32) for _ in range(4)]


def _mistakes(x, w) -> dict[str, np.ndarray]:
    def variant(**knobs):
        return oa.post_ln_block(x, *w, HEADS, **knobs)

    return {HINT_PRE_LN: variant(wiring="pre_ln"), HINT_RESIDUAL: variant(wiring="no_residual"),
            HINT_TRANSPOSED: variant(transpose_weights=True), HINT_BESSEL: variant(ddof=1),
            HINT_SCALE: variant(scale=1.0), HINT_SCALE_D: variant(scale=1 / np.sqrt(D_MODEL))}


def check_normalize(ctx: StepContext) -> None:
    x = np.random.default_rng(140).standard_normal((2, 3, D_MODEL)).astype(np.float32) * 3 + 1
    got = maxrun.lazily(ctx.learner.normalize, maxrun.tensor(x), what="normalize")
    ones, zeros = np.ones(D_MODEL), np.zeros(D_MODEL)
    compare(got, oracle.layer_norm(x, ones, zeros), "normalize on (2, 3, d_model)",
            "(x - mean) / sqrt(var + 1e-5) over the last axis",
            lambda: {HINT_BESSEL: oracle.layer_norm(x, ones, zeros, ddof=1),
                     "eps goes inside the square root": oracle.layer_norm(x, ones, zeros, eps_inside_sqrt=False)})
    # Rows that barely vary (variance ~1e-6, below eps): there eps decides the
    # result, so a sign error in it shows (with a variance of ~9 it moves the
    # output by ~1e-6, inside the tolerance).
    flat = (1.0 + 1e-3 * np.random.default_rng(145).standard_normal((2, 3, D_MODEL))).astype(np.float32)
    got = maxrun.lazily(ctx.learner.normalize, maxrun.tensor(flat), what="normalize")
    compare(got, oracle.layer_norm(flat, ones, zeros), "normalize on rows that barely vary (variance below eps)",
            "(x - mean) / sqrt(var + 1e-5): eps is added to the variance",
            lambda: {HINT_EPS_SIGN: oracle.layer_norm(flat, ones, zeros, eps=-1e-5),
                     "add eps = 1e-5 to the variance": oracle.layer_norm(flat, ones, zeros, eps=0.0),
                     HINT_BESSEL: oracle.layer_norm(flat, ones, zeros, ddof=1)})


def check_block(ctx: StepContext) -> None:
    w = _weights(141)
    rng = np.random.default_rng(142)
    for n, t in maxrun.SHAPES:
        x = rng.standard_normal((n, t, D_MODEL)).astype(np.float32)
        got = maxrun.lazily(ctx.learner.post_ln_attention_block, *map(maxrun.tensor, (x, *w)), HEADS,
                            what="post_ln_attention_block")
        compare(got, oa.post_ln_block(x, *w, HEADS), f"post_ln_attention_block on x {[n, t, D_MODEL]}, {HEADS} heads",
                "LayerNorm(x + concat(heads) @ w_o), heads from x @ w_q, x @ w_k, x @ w_v", lambda: _mistakes(x, w))


def check_one_head(ctx: StepContext) -> None:
    w = _weights(143)
    x = np.random.default_rng(144).standard_normal((2, 5, D_MODEL)).astype(np.float32)
    got = maxrun.lazily(ctx.learner.post_ln_attention_block, *map(maxrun.tensor, (x, *w)), 1, what="one head")
    compare(got, oa.post_ln_block(x, *w, 1), "one head (d_h = d_model)", "the head count must come from num_heads")


def check_bad_heads(ctx: StepContext) -> None:
    from max.experimental import functional as F

    w = [maxrun.tensor(m) for m in _weights(145)]
    x = maxrun.tensor(np.zeros((1, 2, D_MODEL), np.float32))
    try:
        with maxrun.interpreter(), F.lazy():
            ctx.learner.post_ln_attention_block(x, *w, 5)
    except ValueError as exc:
        if "5" in str(exc) and str(D_MODEL) in str(exc):
            return
        raise CheckFailed(f"the ValueError says {str(exc)!r}",
                          f"name both numbers: num_heads (5), d_model ({D_MODEL})") from None
    raise CheckFailed(f"num_heads = 5 with d_model = {D_MODEL} did not raise ValueError",
                      "check d_model % num_heads == 0 first; raise ValueError naming both")


CHECKS = [
    Check("normalize: layer norm without gamma and beta", check_normalize, "(x - mean) * rsqrt(var + eps)"),
    Check("the block matches the numpy oracle at batch 1-2, lengths 1, 7, 70", check_block,
          "LayerNorm(x + MultiHead(x) W_o)"),
    Check("one head", check_one_head, "d_h = d_model // num_heads"),
    Check("num_heads that does not divide d_model raises ValueError", check_bad_heads, "raise ValueError naming both"),
]
