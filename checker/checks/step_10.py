"""Checks for step 10: GPT2Model."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, StepContext, compare

USES_MAX = True
CONFIG = maxrun.SMALL_CONFIG
H, N_LAYER = CONFIG["n_head"], CONFIG["n_layer"]
USES = "this step runs your steps 03, 05, 06 and 09 (and what they use): make sure their checks pass"
HINT_OWN_CACHE = ("give block i its own cache: block(x, caches[i]); if you do, run the checks of steps 09 and 07: "
                  "their forwards pass the cache on and add the new keys and values to it")


def _modules(ctx: StepContext):
    return maxrun.paired_modules(ctx, "GPT2Model", seed=10)


def caches_of(past: list | None = None, n_layer: int = N_LAYER) -> list:
    """One of step 07's ConcatCaches (the solution's) per block: holding ``past``,
    a numpy (keys, values) per block, or empty. The solution's, so that these
    checks name this step's mistakes; the learner's is checked in step 07."""
    from solutions.solution_07 import ConcatCache

    return [maxrun.cache_of(ConcatCache, kv) for kv in (past or [None] * n_layer)]


def call(module, ids: np.ndarray, past: list | None = None, *args, empty: str = HINT_OWN_CACHE, what: str = "forward"):
    """``module(ids, caches, *args)`` with caches holding ``past`` (or empty);
    numpy (output, [(keys, values) per block]) as they are after the call."""
    return maxrun.run_cached(module, ids, caches_of(past), *args, empty=empty, what=what)


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(
        ctx, "GPT2Model", "wte, wpe, h (an nn.ModuleList of n_layer GPT2Blocks: h.0, h.1, ...) and ln_f")


def check_forward(ctx: StepContext) -> None:
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(100)
    for batch, seq in maxrun.SHAPES:
        ids = rng.integers(0, CONFIG["vocab_size"], size=(batch, seq)).astype(np.int64)
        what = f"GPT2Model on ids of shape {[batch, seq]}"
        got = maxrun.output_alone(maxrun.run(learner, ids), what, "end with `return self.ln_f(x)`")
        compare(got, maxrun.run(solution, ids), what, USES, lambda: {
            "apply the final layer norm ln_f after the last block": oracle.gpt2(ids, weights, H, final_norm=False)[0],
            "add the position embeddings: x = wte(ids) + wpe(seq_len, past_len)":
                oracle.gpt2(ids, weights, H, positions=False)[0],
        })


def check_caches_filled(ctx: StepContext) -> None:
    # forward(ids, new_caches(n_layer)), as the app's first call: every block
    # fills its own cache with its keys and values.
    learner, solution, _ = _modules(ctx)
    ids = np.random.default_rng(103).integers(0, CONFIG["vocab_size"], size=(2, 7)).astype(np.int64)
    what = "GPT2Model on ids of shape [2, 7] with empty caches"
    got, expected = call(learner, ids, what=what), call(solution, ids)
    compare(got[0], expected[0], what, HINT_OWN_CACHE)
    for i, ((k, v), (ek, ev)) in enumerate(zip(got[1], expected[1])):
        compare(k, ek, f"the keys block {i}'s cache holds after forward", HINT_OWN_CACHE)
        compare(v, ev, f"the values block {i}'s cache holds after forward", HINT_OWN_CACHE)


EPS = maxrun.OTHER_EPS
HINT_EPS = ("build ln_f with eps=config.layer_norm_epsilon: LayerNorm's default (1e-5) ignores a checkpoint "
            "whose config says otherwise (or your step 03's LayerNorm ignores its eps: run its checks)")


def check_layer_norm_epsilon(ctx: StepContext) -> None:
    learner, solution, weights = maxrun.paired_modules(ctx, "GPT2Model", seed=10,
                                                       config=dict(CONFIG, layer_norm_epsilon=EPS))
    ids = np.random.default_rng(102).integers(0, CONFIG["vocab_size"], size=(1, 7)).astype(np.int64)
    got, expected = maxrun.run(learner, ids), maxrun.run(solution, ids)
    compare(got, expected, f"GPT2Model with layer_norm_epsilon = {EPS}", HINT_EPS, lambda: {
        HINT_EPS: oracle.gpt2(ids, weights, H, eps=EPS, final_eps=1e-5)[0],
        "your step 09's blocks ignore config.layer_norm_epsilon: run its checks":
            oracle.gpt2(ids, weights, H, eps=1e-5, final_eps=EPS)[0],
    })


def check_cache(ctx: StepContext) -> None:
    learner, solution, weights = _modules(ctx)
    ids = np.random.default_rng(101).integers(0, CONFIG["vocab_size"], size=(2, 12)).astype(np.int64)
    full = call(solution, ids)
    past = call(solution, ids[:, :-3])[1]
    got = call(learner, ids[:, -3:], past)
    compare(got[0], full[0][:, -3:], "3 new tokens after 9 cached",
            "give each block its own cache, caches[i], and start the positions at past_len",
            lambda: {"the new tokens' positions start at past_len = caches[0].length (read before the blocks "
                     "add to it), not 0":
                     oracle.gpt2(ids[:, -3:], weights, H, past=past, offset_positions=False)[0]})
    for i, ((k, _), (ek, _)) in enumerate(zip(got[1], full[1])):
        compare(k, ek, f"the keys block {i}'s cache holds after 3 new tokens after 9 cached", HINT_OWN_CACHE)


CHECKS = [
    Check("wte, wpe, h.0..h.N, ln_f with Hugging Face's parameter names", check_parameters,
          "self.wte, self.wpe, self.h = nn.ModuleList([...]), self.ln_f"),
    Check("matches the solution at batch 1-2, lengths 1, 7, 70", check_forward, USES),
    Check("with empty caches, block i fills caches[i] with its keys and values", check_caches_filled,
          HINT_OWN_CACHE),
    Check("with a KV cache, new tokens match a full forward", check_cache, "positions start at past_len"),
    Check(f"ln_f takes the config's layer_norm_epsilon ({EPS})", check_layer_norm_epsilon, HINT_EPS),
]
