"""Checks for step 07: GPT2MultiHeadAttention.

Each helper (_split_heads, _merge_heads, _attn) is checked on its own first,
so a mistake is named where it is made; the whole forward is then compared
with the solution, plain and with a KV cache.
"""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, CheckFailed, StepContext, compare

USES_MAX = True
CONFIG = maxrun.SMALL_CONFIG
E, H = CONFIG["n_embd"], CONFIG["n_head"]
D = E // H

HINT_SCALE = "scale the scores by 1 / sqrt(head_dim): (q @ k^T) / sqrt(head_dim)"
HINT_SCALE_EMBD = "the scale is 1 / sqrt(head_dim) (each head's width), not 1 / sqrt(n_embd)"
HINT_NO_MASK = "add the causal mask (step 02) to the scores: without it tokens see the future"
HINT_MASK_AFTER = "add the mask to the scores *before* the softmax, so hidden positions get weight 0"
HINT_AXIS = "softmax over the last axis (the keys): each query's weights must sum to 1"
HINT_SPLIT = ("split heads with reshape [b, t, h, d] then transpose(1, 2); "
              "a reshape to [b, h, t, d] alone mixes positions")
HINT_MERGE = "merge heads with transpose(1, 2) first, then reshape to [b, t, n_embd]"
HINT_ORDER = "c_attn's output is Q, K, V in that order: split it into three n_embd-wide parts"


def _modules(ctx: StepContext):
    return maxrun.paired_modules(ctx, "GPT2MultiHeadAttention", seed=7)


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(
        ctx, "GPT2MultiHeadAttention",
        "c_attn = Linear(n_embd, 3 * n_embd) and c_proj = Linear(n_embd, n_embd), with bias")


def check_split_heads(ctx: StepContext) -> None:
    learner, _, _ = _modules(ctx)
    x = np.arange(2 * 5 * E, dtype=np.float32).reshape(2, 5, E)
    got = maxrun.lazily(learner._split_heads, maxrun.tensor(x), what="_split_heads")
    compare(got, oracle.split_heads(x, H), "_split_heads on [2, 5, n_embd]", HINT_SPLIT,
            lambda: {HINT_SPLIT: oracle.split_heads(x, H, transpose=False)})


def check_merge_heads(ctx: StepContext) -> None:
    learner, _, _ = _modules(ctx)
    x = np.arange(2 * H * 5 * D, dtype=np.float32).reshape(2, H, 5, D)
    got = maxrun.lazily(learner._merge_heads, maxrun.tensor(x), what="_merge_heads")
    compare(got, oracle.merge_heads(x), "_merge_heads on [2, n_head, 5, head_dim]", HINT_MERGE,
            lambda: {HINT_MERGE: oracle.merge_heads(x, transpose=False)})


def _attn_mistakes(q, k, v, mask) -> dict[str, np.ndarray]:
    return {
        HINT_SCALE: oracle.attend(q, k, v, mask, scale=1.0),
        HINT_SCALE_EMBD: oracle.attend(q, k, v, mask, scale=1 / np.sqrt(E)),
        HINT_NO_MASK: oracle.attend(q, k, v, None),
        HINT_MASK_AFTER: oracle.attend(q, k, v, mask, mask_after_softmax=True),
        HINT_AXIS: oracle.attend(q, k, v, mask, softmax_axis=-2),
    }


def check_attn(ctx: StepContext) -> None:
    learner, _, _ = _modules(ctx)
    rng = np.random.default_rng(70)
    for seq, past in ((6, 0), (3, 4)):
        q = rng.standard_normal((2, H, seq, D)).astype(np.float32)
        k = rng.standard_normal((2, H, past + seq, D)).astype(np.float32)
        v = rng.standard_normal((2, H, past + seq, D)).astype(np.float32)
        mask = oracle.causal_mask(seq, past)
        got = maxrun.lazily(learner._attn, *map(maxrun.tensor, (q, k, v, mask)), what="_attn")
        if not np.isfinite(got).all():
            raise CheckFailed(f"_attn with {seq} queries and {past} cached keys gave inf/NaN", HINT_MASK_AFTER)
        compare(got, oracle.attend(q, k, v, mask), f"_attn with {seq} queries and {past} cached keys",
                "softmax(q @ k^T / sqrt(head_dim) + mask, axis=-1) @ v", lambda: _attn_mistakes(q, k, v, mask))


def _forward_mistakes(x, w, output: int = 0) -> dict[str, np.ndarray]:
    """Known mistakes' outputs; ``output`` 0, 1, 2: the output, keys, values."""
    def variant(**knobs):
        return oracle.attention(x, w, H, **knobs)[output]

    mistakes = {f"{HINT_ORDER} (yours reads them as {', '.join(order.upper())})": variant(order=order)
                for order in ("kqv", "vkq", "qvk", "kvq", "vqk")}
    mistakes.update({
        HINT_SPLIT: variant(split_transpose=False),
        HINT_MERGE: variant(merge_transpose=False),
        HINT_SCALE: variant(scale=1.0),
        HINT_SCALE_EMBD: variant(scale=1 / np.sqrt(E)),
        HINT_NO_MASK: variant(causal=False),
        HINT_AXIS: variant(softmax_axis=-2),
    })
    return mistakes


def check_forward(ctx: StepContext) -> None:
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(71)
    for batch, seq in maxrun.SHAPES:
        x = rng.standard_normal((batch, seq, E)).astype(np.float32)
        got = maxrun.run(learner, x)
        if not isinstance(got, tuple) or len(got) != 3:
            raise CheckFailed("forward must return a tuple (output, keys, values)",
                              "end forward with `return self.c_proj(...), k, v`")
        expected = maxrun.run(solution, x)
        what = f"attention on x of shape {[batch, seq, E]}"
        compare(got[0], expected[0], what, "see the math at the top of the step",
                lambda: _forward_mistakes(x, weights))
        compare(got[1], expected[1], f"{what}: returned keys [batch, n_head, seq, head_dim]",
                "return the keys after _split_heads (and after the cache concat)",
                lambda: _forward_mistakes(x, weights, output=1))
        compare(got[2], expected[2], f"{what}: returned values", "return the values after _split_heads",
                lambda: _forward_mistakes(x, weights, output=2))


def check_cache(ctx: StepContext) -> None:
    # The last tokens computed with the earlier ones cached must equal the same
    # rows of a full forward: that is what makes a KV cache exact.
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(72)
    for batch, seq, new in ((1, 9, 1), (2, 70, 3)):
        x = rng.standard_normal((batch, seq, E)).astype(np.float32)
        full = maxrun.run(solution, x)
        _, past_k, past_v = maxrun.run(solution, x[:, :-new])
        got = maxrun.run(learner, x[:, -new:], past_k, past_v)
        what = f"{new} new token(s) after {seq - new} cached"
        compare(got[0], full[0][:, -new:], what,
                "concat the cached keys/values before the new ones (axis 2) and mask with past_len = cached length",
                lambda: {HINT_NO_MASK: oracle.attention(x[:, -new:], weights, H, past=(past_k, past_v),
                                                        causal=False)[0]})
        compare(got[1], full[1], f"{what}: returned keys", "return the cached keys followed by the new ones")
        compare(got[2], full[2], f"{what}: returned values", "return the cached values followed by the new ones")


CHECKS = [
    Check("parameters c_attn [3*n_embd, n_embd] and c_proj [n_embd, n_embd], with bias", check_parameters,
          "c_attn = Linear(n_embd, 3 * n_embd), c_proj = Linear(n_embd, n_embd)"),
    Check("_split_heads: [b, t, n_embd] -> [b, n_head, t, head_dim]", check_split_heads, HINT_SPLIT),
    Check("_merge_heads: [b, n_head, t, head_dim] -> [b, t, n_embd]", check_merge_heads, HINT_MERGE),
    Check("_attn: scaled, masked softmax attention", check_attn,
          "softmax(q @ k^T / sqrt(head_dim) + mask, axis=-1) @ v"),
    Check("forward matches the solution at batch 1-2, lengths 1, 7, 70", check_forward,
          "c_attn -> split Q, K, V -> heads -> _attn -> merge -> c_proj"),
    Check("with a KV cache, new tokens match a full forward", check_cache,
          "concat cached keys/values first; mask with the cached length"),
]
