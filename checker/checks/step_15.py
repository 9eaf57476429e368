"""Checks for bonus step 15: attention that returns its probabilities."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker import oracle_attention as oa
from checker.harness import Check, CheckFailed, StepContext, compare

USES_MAX = True
CONFIG = maxrun.SMALL_CONFIG
E, H = CONFIG["n_embd"], CONFIG["n_head"]

HINT_SCORES = "return the probabilities, after the softmax, not the raw scores"
HINT_NO_MASK = "add the causal mask before the softmax: future keys must get weight 0"
HINT_SCALE = "scale the scores by 1 / sqrt(head_dim) before the softmax"
HINT_AXIS = "softmax over the last axis (the keys)"


def _modules(ctx: StepContext):
    return maxrun.paired_modules(ctx, "GPT2AttentionWithWeights", seed=15)


def _probs(x, w, past_k=None, knobs: str = "") -> np.ndarray:
    qkv = oracle.linear(x, w["c_attn.weight"], w["c_attn.bias"])
    q, k, _ = (oracle.split_heads(m, H) for m in np.split(qkv, 3, axis=-1))
    if past_k is not None:
        k = np.concatenate([past_k, k], axis=2)
    t = x.shape[1]
    mask = None if knobs == "no_mask" else oracle.causal_mask(t, k.shape[2] - t)
    scores = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / np.sqrt(E // H)
    if knobs == "scores":
        return (scores + (0 if mask is None else mask)).astype(np.float32)
    if knobs == "no_scale":
        return oracle.softmax(scores * np.sqrt(E // H) + mask).astype(np.float32)
    if knobs == "axis":
        return oracle.softmax(scores + mask, axis=-2).astype(np.float32)
    return oa.attention_probs(q, k, mask)


def _mistakes(x, w, past_k=None):
    return {HINT_SCORES: _probs(x, w, past_k, "scores"), HINT_NO_MASK: _probs(x, w, past_k, "no_mask"),
            HINT_SCALE: _probs(x, w, past_k, "no_scale"), HINT_AXIS: _probs(x, w, past_k, "axis")}


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(ctx, "GPT2AttentionWithWeights",
                                 "subclass step 07's GPT2MultiHeadAttention: same c_attn and c_proj")


HINT_PAIR = "end with `return out, self.kept.weights` when return_weights is set"


def _with_weights(result, what: str) -> tuple:
    """forward's result with return_weights=True, which must be (output, weights)."""
    if not isinstance(result, tuple) or len(result) != 2:
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else "one tensor"
        raise CheckFailed(f"{what} returned {got}; with return_weights=True, forward returns (output, weights)",
                          HINT_PAIR)
    return result


def check_default_is_step_07(ctx: StepContext) -> None:
    from solutions.solution_07 import ConcatCache, GPT2MultiHeadAttention

    learner, _, weights = _modules(ctx)
    step07 = maxrun.build(GPT2MultiHeadAttention, ctx.solution.GPT2Config(**CONFIG), weights=weights)
    rng = np.random.default_rng(150)
    for batch, seq in maxrun.SHAPES:
        x = rng.standard_normal((batch, seq, E)).astype(np.float32)
        got = maxrun.run_cached(learner, x, ConcatCache(), empty="call step 07's forward: super().forward(x, cache)")
        if isinstance(got[0], tuple):
            raise CheckFailed(f"forward(x, cache) without return_weights returned a tuple of {len(got[0])}; "
                              "expected the output alone, as step 07's forward returns it",
                              "return the weights only when return_weights=True: `return out` otherwise")
        expected = maxrun.run_cached(step07, x, ConcatCache())
        for name, g, e in zip(("output", "keys the cache holds", "values the cache holds"), got, expected):
            compare(g, e, f"{name} on x {[batch, seq, E]} (return_weights=False)", "keep step 07's forward unchanged")


def check_weights(ctx: StepContext) -> None:
    learner, solution, w = _modules(ctx)
    rng = np.random.default_rng(151)
    for batch, seq in ((1, 1), (2, 7), (2, 33)):
        x = rng.standard_normal((batch, seq, E)).astype(np.float32)
        out, probs = _with_weights(maxrun.run(learner, x, return_weights=True), "forward(x, return_weights=True)")
        if list(probs.shape) != [batch, H, seq, seq]:
            raise CheckFailed(f"weights have shape {list(probs.shape)}, expected {[batch, H, seq, seq]}",
                              "return the softmax output itself: [batch, n_head, seq, past + seq]")
        what = f"weights on x {[batch, seq, E]}"
        if probs.min() < 0 or probs.max() > 1 + 1e-6:
            raise CheckFailed(f"{what} range over {probs.min():.3g}..{probs.max():.3g}, not probabilities in [0, 1]",
                              HINT_SCORES)
        compare(probs, _probs(x, w), what, "softmax(q k^T / sqrt(head_dim) + mask, axis=-1)", lambda: _mistakes(x, w))
        compare(out, maxrun.run(solution, x), f"output on x {[batch, seq, E]} (return_weights=True)",
                "the output is weights @ v, merged and projected, as without return_weights")


def check_rows_and_future(ctx: StepContext) -> None:
    learner, _, _ = _modules(ctx)
    x = np.random.default_rng(152).standard_normal((2, 9, E)).astype(np.float32)
    probs = _with_weights(maxrun.run(learner, x, return_weights=True), "forward(x, return_weights=True)")[1]
    sums = probs.sum(-1)
    if not np.allclose(sums, 1, atol=1e-5):
        raise CheckFailed(f"rows of the weights sum to {sums.min():.4f}..{sums.max():.4f}, not 1",
                          "softmax over the last axis (the keys)")
    future = np.triu(np.ones((9, 9), bool), k=1)
    if np.abs(probs[..., future]).max() != 0:
        raise CheckFailed(f"future positions get weight up to {np.abs(probs[..., future]).max():.3g}, not 0",
                          HINT_NO_MASK)


def check_cache(ctx: StepContext) -> None:
    from solutions.solution_07 import ConcatCache

    learner, solution, w = _modules(ctx)
    x = np.random.default_rng(153).standard_normal((2, 10, E)).astype(np.float32)
    past = maxrun.run_cached(solution, x[:, :7], ConcatCache())[1:]
    got = maxrun.run_cached(learner, x[:, 7:], maxrun.cache_of(ConcatCache, past), return_weights=True,
                            empty="pass the cache on: super().forward(x, cache)")
    probs = _with_weights(got[0], "forward(x, cache, return_weights=True)")[1]
    compare(probs, _probs(x, w)[:, :, 7:], "weights of 3 new tokens after 7 cached ([2, n_head, 3, 10])",
            "with a cache the weights cover the cached keys too: [batch, n_head, seq, past + seq]",
            lambda: _mistakes(x[:, 7:], w, past[0]))


CHECKS = [
    Check("parameters as step 07 (c_attn, c_proj)", check_parameters, "subclass GPT2MultiHeadAttention"),
    Check("without return_weights: exactly step 07's output and cache", check_default_is_step_07,
          "return the weights only when asked"),
    Check("with return_weights: the probabilities [batch, n_head, seq, seq]", check_weights,
          "softmax(q k^T / sqrt(head_dim) + mask)"),
    Check("every row sums to 1; future positions are exactly 0", check_rows_and_future,
          "mask before softmax, softmax over the keys"),
    Check("with a KV cache: weights over cached and new keys", check_cache, "[batch, n_head, seq, past + seq]"),
]
