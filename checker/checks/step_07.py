"""Checks for step 07: GPT2MultiHeadAttention.

Each helper (_split_heads, _merge_heads, _attn) and the cache's methods
(ConcatCache.update, length, attend) are checked on their own first, so a
mistake is named where it is made; the whole forward is then compared with the
solution, with an empty cache and with a filled one.
"""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, CheckFailed, StepContext, close, compare

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
HINT_CONCAT = "the cached keys followed by the new ones: F.concat([self.keys, k], axis=2) (values alike)"
HINT_KEEP = ("keep the result: self.keys, self.values = k, v after the concat, so that the next update "
             "(and length) finds every position so far")
HINT_ATTEND_MASK = ("build the mask from attend's arguments: causal_mask(seq, k.shape[2] - seq, dtype=q.dtype, "
                    "device=q.device), where seq = q.shape[2] and k holds the cached keys and the new ones; not "
                    "self.length, which after update counts the new rows too (the app's cache borrows attend, so it "
                    "reads only its arguments)")
HINT_MASK_DTYPE = ("make the mask in q's dtype and on q's device: causal_mask(..., dtype=q.dtype, device=q.device); "
                   "it is added to the scores (bfloat16 on a GPU)")
HINT_RETURNS = "end forward with `return self.c_proj(...)`, the output alone"
HINT_NO_PROJ = ("project the merged heads with c_proj: return self.c_proj(self._merge_heads(...)); "
                "c_proj mixes what the heads found (the last line of the math at the top of the step)")
HINT_HEADS_LEFT = "merge the heads before c_proj: self.c_proj(self._merge_heads(cache.attend(...)))"
HINT_FORWARD = ("c_attn -> split into Q, K, V -> _split_heads -> cache.update -> cache.attend(q, k, v, self._attn) "
                "-> _merge_heads -> c_proj: compare each with the math at the top of the step")
HINT_USE_CACHE = ("hand k, v to the cache you are given: k, v = cache.update(k, v); "
                  "make a ConcatCache only when it is None")


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


def _pair(result, what: str) -> tuple:
    """update's result, which must be (keys, values)."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise CheckFailed(f"{what} returned {type(result).__name__}, expected a tuple (keys, values)",
                          "end update with `return k, v`: the cached and new keys and values")
    return result


def _two_updates(cache_class, k1, v1, k2, v2):
    """An empty cache updated twice: what each update returned, and what the cache held after each."""
    cache = cache_class()
    first = _pair(cache.update(k1, v1), "update(k, v) on an empty cache")
    if cache.keys is None or cache.values is None:
        raise CheckFailed("after update(k, v) on an empty ConcatCache, its keys/values are still None", HINT_KEEP)
    held_first = cache.keys, cache.values
    second = _pair(cache.update(k2, v2), "a second update(k, v)")
    return first, held_first, second, (cache.keys, cache.values)


def _two_calls(seed: int) -> tuple[np.ndarray, ...]:
    """k1, v1 with 3 positions, then k2, v2 with 2: [2, n_head, positions, head_dim]."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((2, H, n, D)).astype(np.float32) for n in (3, 3, 2, 2))


def check_cache_update(ctx: StepContext) -> None:
    k1, v1, k2, v2 = _two_calls(73)
    first, held_first, second, held = maxrun.lazily(
        _two_updates, ctx.learner.ConcatCache, *map(maxrun.tensor, (k1, v1, k2, v2)), what="ConcatCache.update")
    for i, name, (old, new) in ((0, "keys", (k1, k2)), (1, "values", (v1, v2))):
        compare(first[i], old, f"update on an empty cache: the {name} it returns",
                "an empty cache has nothing to put first: return this call's k, v")
        compare(held_first[i], old, f"update on an empty cache: the {name} it keeps", HINT_KEEP)
        both = np.concatenate([old, new], axis=2)
        what = f"update of a cache holding 3 positions with 2 more: the {name} it"
        _not_alone(second[i], new, f"{what} returns",
                   "return the cached and the new together (the concat), not only this call's")
        compare(second[i], both, f"{what} returns", HINT_CONCAT,
                lambda: {HINT_CONCAT: np.concatenate([new, old], axis=2)})
        _not_alone(held[i], new, f"{what} keeps",
                   "keep the concatenated keys and values (the cached and the new), not only this call's")
        compare(held[i], both, f"{what} keeps", HINT_KEEP, lambda: {HINT_KEEP: old})


def _not_alone(got: np.ndarray, new: np.ndarray, what: str, hint: str) -> None:
    """Fails with ``hint`` when ``got`` is this update's k (or v) alone, without the cached ones
    (compare names a mistake only when it has the expected shape)."""
    if close(got, new):
        raise CheckFailed(f"{what}: only this call's 2 positions, not all 5", hint)


def _lengths(cache_class, k1, v1, k2, v2) -> np.ndarray:
    """An empty cache's length, then after update with 3 positions, then with 2 more."""
    cache = cache_class()
    lengths = [cache.length]
    for k, v in ((k1, v1), (k2, v2)):
        cache.update(k, v)
        lengths.append(cache.length)
    return np.array([int(n) for n in lengths])


def check_cache_length(ctx: StepContext) -> None:
    # Step 10 reads caches[0].length for the positions of the new tokens.
    got = maxrun.lazily(_lengths, ctx.learner.ConcatCache, *map(maxrun.tensor, _two_calls(76)),
                        what="ConcatCache.length").tolist()
    if got != [0, 3, 5]:
        raise CheckFailed(f"ConcatCache's length was {got} (empty, after update with 3 positions, after 2 more), "
                          "expected [0, 3, 5]",
                          "length is 0 while keys is None, then self.keys.shape[2]: the positions are axis 2 of "
                          "[batch, n_head, positions, head_dim]")


def _mask_given(q, k, v, mask):
    """A stand-in for _attn that returns the mask attend hands it."""
    return mask


def check_cache_attend(ctx: StepContext) -> None:
    # attend runs after update: k and v hold the cached positions and the new
    # ones. Called on an empty cache, as the app's cache borrows it
    # (ConcatCache().attend), with a stand-in attn that returns the mask.
    rng = np.random.default_rng(74)
    for seq, past in ((5, 0), (2, 4)):
        q = rng.standard_normal((2, H, seq, D)).astype(np.float32)
        k, v = (rng.standard_normal((2, H, past + seq, D)).astype(np.float32) for _ in range(2))
        what = f"ConcatCache().attend with {seq} queries and {past + seq} keys"
        mask = maxrun.lazily(lambda q, k, v: ctx.learner.ConcatCache().attend(q, k, v, _mask_given),
                             *map(maxrun.tensor, (q, k, v)), what=what)
        compare(mask, oracle.causal_mask(seq, past), f"{what}: the mask it hands to attn", HINT_ATTEND_MASK)
    # In float64 (MAX's interpreter runs it; the app's GPU runs bfloat16): the mask must follow q.
    q, k, v = (rng.standard_normal((1, H, 3, D)) for _ in range(3))
    mask = maxrun.lazily(lambda q, k, v: ctx.learner.ConcatCache().attend(q, k, v, _mask_given),
                         *map(maxrun.tensor, (q, k, v)), what="ConcatCache().attend with float64 q, k, v")
    if mask.dtype != np.float64:
        raise CheckFailed(f"ConcatCache().attend with float64 q, k, v handed attn a {mask.dtype} mask", HINT_MASK_DTYPE)


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
        HINT_NO_PROJ: variant(project=False),
    })
    return mistakes


def check_forward(ctx: StepContext) -> None:
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(71)
    for batch, seq in maxrun.SHAPES:
        x = rng.standard_normal((batch, seq, E)).astype(np.float32)
        what = f"attention on x of shape {[batch, seq, E]}"
        got = maxrun.run_cached(learner, x, ctx.learner.ConcatCache(), what=what, empty=HINT_USE_CACHE)
        out = maxrun.output_alone(got[0], f"forward(x, cache) on x of shape {[batch, seq, E]}", HINT_RETURNS)
        if list(out.shape) == [batch, H, seq, D]:
            raise CheckFailed(f"{what}: the output is [batch, n_head, seq, head_dim] {list(out.shape)}, "
                              f"expected {[batch, seq, E]}", HINT_HEADS_LEFT)
        expected = maxrun.run_cached(solution, x, ctx.solution.ConcatCache())
        compare(out, expected[0], what, HINT_FORWARD, lambda: _forward_mistakes(x, weights))
        compare(got[1], expected[1], f"{what}: the keys the cache holds after forward [batch, n_head, seq, head_dim]",
                "hand cache.update the keys after _split_heads", lambda: _forward_mistakes(x, weights, output=1))
        compare(got[2], expected[2], f"{what}: the values the cache holds after forward",
                "hand cache.update the values after _split_heads", lambda: _forward_mistakes(x, weights, output=2))
    # Without a cache (cache=None) forward makes one for the call: step 15 and
    # the checks of steps 09-11 call it so.
    x = rng.standard_normal((2, 7, E)).astype(np.float32)
    got = maxrun.output_alone(maxrun.run(learner, x, what="forward(x)"), "forward(x) without a cache", HINT_RETURNS)
    compare(got, maxrun.run(solution, x), "forward(x) without a cache, on x of shape [2, 7, n_embd]",
            "with cache=None, make a ConcatCache() for this call: cache = ConcatCache() if cache is None else cache")


class _Recording:
    """A cache (the solution's ConcatCache) that notes which of its methods
    forward calls; everything else is the wrapped cache's."""

    def __init__(self, cache) -> None:
        self.cache, self.calls = cache, []

    def __getattr__(self, name):
        return getattr(self.cache, name)

    def update(self, k, v):
        self.calls.append("update")
        return self.cache.update(k, v)

    def attend(self, q, k, v, attn):
        self.calls.append("attend")
        return self.cache.attend(q, k, v, attn)


HINT_THROUGH = ("k, v = cache.update(k, v), then cache.attend(q, k, v, self._attn): the app's and the server's "
                "caches keep the keys and values their own way, and the server attends with its own kernel, so "
                "forward reaches them only through these two calls")


def check_through_cache(ctx: StepContext) -> None:
    learner, _, _ = _modules(ctx)
    x = np.random.default_rng(75).standard_normal((2, 7, E)).astype(np.float32)
    cache = _Recording(ctx.solution.ConcatCache())
    maxrun.run_cached(learner, x, cache, what="forward(x, cache)", empty=HINT_USE_CACHE)
    if cache.calls != ["update", "attend"]:
        called = ", then ".join(f"cache.{name}" for name in cache.calls) or "neither"
        raise CheckFailed(f"forward(x, cache) called {called}; expected cache.update, then cache.attend, once each",
                          HINT_THROUGH)


def check_cache(ctx: StepContext) -> None:
    # The last tokens computed with the earlier ones cached must equal the same
    # rows of a full forward: that is what makes a KV cache exact.
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(72)
    for batch, seq, new in ((1, 9, 1), (2, 70, 3)):
        x = rng.standard_normal((batch, seq, E)).astype(np.float32)
        full = maxrun.run_cached(solution, x, ctx.solution.ConcatCache())
        past = maxrun.run_cached(solution, x[:, :-new], ctx.solution.ConcatCache())[1:]
        got = maxrun.run_cached(learner, x[:, -new:], maxrun.cache_of(ctx.learner.ConcatCache, past),
                                empty=HINT_USE_CACHE)
        what = f"{new} new token(s) after {seq - new} cached"
        compare(got[0], full[0][:, -new:], what,
                "hand k, v to cache.update and attend through cache.attend: the new rows see the cached keys",
                lambda: {HINT_NO_MASK: oracle.attention(x[:, -new:], weights, H, past=past, causal=False)[0]})
        compare(got[1], full[1], f"{what}: the keys the cache holds after forward", HINT_CONCAT)
        compare(got[2], full[2], f"{what}: the values the cache holds after forward", HINT_CONCAT)


CHECKS = [
    Check("parameters c_attn [3*n_embd, n_embd] and c_proj [n_embd, n_embd], with bias", check_parameters,
          "c_attn = Linear(n_embd, 3 * n_embd), c_proj = Linear(n_embd, n_embd)"),
    Check("_split_heads: [b, t, n_embd] -> [b, n_head, t, head_dim]", check_split_heads, HINT_SPLIT),
    Check("_merge_heads: [b, n_head, t, head_dim] -> [b, t, n_embd]", check_merge_heads, HINT_MERGE),
    Check("_attn: scaled, masked softmax attention", check_attn,
          "softmax(q @ k^T / sqrt(head_dim) + mask, axis=-1) @ v"),
    Check("ConcatCache.update: the cached keys/values, then the new ones (axis 2), kept", check_cache_update,
          HINT_CONCAT),
    Check("ConcatCache.length: 0 when empty, else the cached positions", check_cache_length,
          "0 if self.keys is None else self.keys.shape[2]"),
    Check("ConcatCache.attend: the causal mask for the new rows after the cached ones", check_cache_attend,
          HINT_ATTEND_MASK),
    Check("forward returns the output alone and matches the solution at batch 1-2, lengths 1, 7, 70",
          check_forward, HINT_FORWARD),
    Check("forward works through the cache: cache.update, then cache.attend", check_through_cache, HINT_THROUGH),
    Check("with a KV cache, new tokens match a full forward", check_cache,
          "hand k, v to cache.update; attend through cache.attend"),
]
