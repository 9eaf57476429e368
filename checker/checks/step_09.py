"""Checks for step 09: GPT2Block."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, StepContext, compare

USES_MAX = True
CONFIG = maxrun.SMALL_CONFIG
E, H = CONFIG["n_embd"], CONFIG["n_head"]
USES = "this step runs your steps 03, 04, 07 and 08: make sure their checks pass"


def _modules(ctx: StepContext):
    return maxrun.paired_modules(ctx, "GPT2Block", seed=9)


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(ctx, "GPT2Block", "children named ln_1, attn, ln_2, mlp (Hugging Face's names)")


def _mistakes(x, w, past=None):
    def variant(wiring):
        return oracle.block(x, w, H, past=past, wiring=wiring)[0]

    return {
        "ln_1 goes before attention and ln_2 before the MLP (they are swapped)": variant("swapped_norms"),
        "add the attention's output to x (the residual): x = x + attn(ln_1(x))": variant("no_attn_residual"),
        "add the MLP's output to x (the residual): x = x + mlp(ln_2(x))": variant("no_mlp_residual"),
        "GPT-2 is pre-LN: x + sublayer(norm(x)), not norm(x + sublayer(x))": variant("post_ln"),
        "attention comes first, then the MLP": variant("mlp_first"),
    }


HINT_PASS_CACHE = ("pass the cache on to the attention: x + self.attn(self.ln_1(x), cache); if you do, run step "
                   "07's checks: its forward adds the new keys and values to the cache")


def check_forward(ctx: StepContext) -> None:
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(90)
    for batch, seq in maxrun.SHAPES:
        x = rng.standard_normal((batch, seq, E)).astype(np.float32)
        what = f"GPT2Block on x of shape {[batch, seq, E]}"
        got = maxrun.output_alone(maxrun.run(learner, x), what,
                                  "end with `return pre_norm_residual(x, self.ln_2, self.mlp)`")
        compare(got, maxrun.run(solution, x), what, USES, lambda: _mistakes(x, weights))


EPS = maxrun.OTHER_EPS
HINT_EPS = ("build ln_1 and ln_2 with eps=config.layer_norm_epsilon: LayerNorm's default (1e-5) ignores a "
            "checkpoint whose config says otherwise (or your step 03's LayerNorm ignores its eps: run its checks)")


def check_layer_norm_epsilon(ctx: StepContext) -> None:
    learner, solution, weights = maxrun.paired_modules(ctx, "GPT2Block", seed=9,
                                                       config=dict(CONFIG, layer_norm_epsilon=EPS))
    x = np.random.default_rng(92).standard_normal((1, 7, E)).astype(np.float32)
    got, expected = maxrun.run(learner, x), maxrun.run(solution, x)
    compare(got, expected, f"GPT2Block with layer_norm_epsilon = {EPS}", HINT_EPS,
            lambda: {HINT_EPS: oracle.block(x, weights, H)[0]})


def check_cache(ctx: StepContext) -> None:
    # The block is handed step 07's ConcatCache (the solution's), holding the
    # first 8 tokens' keys and values; it must reach the attention, which
    # adds the 2 new ones to it.
    from solutions.solution_07 import ConcatCache

    learner, solution, _ = _modules(ctx)
    x = np.random.default_rng(91).standard_normal((2, 10, E)).astype(np.float32)
    full = maxrun.run_cached(solution, x, ConcatCache())
    past = maxrun.run_cached(solution, x[:, :-2], ConcatCache())[1:]
    got = maxrun.run_cached(learner, x[:, -2:], maxrun.cache_of(ConcatCache, past), empty=HINT_PASS_CACHE)
    compare(got[1], full[1], "the keys the cache holds after 2 new tokens after 8 cached", HINT_PASS_CACHE)
    compare(got[0], full[0][:, -2:], "2 new tokens after 8 cached", HINT_PASS_CACHE)


CHECKS = [
    Check("children ln_1, attn, ln_2, mlp with Hugging Face's parameter names", check_parameters,
          "self.ln_1, self.attn, self.ln_2, self.mlp"),
    Check("matches the solution at batch 1-2, lengths 1, 7, 70", check_forward, USES),
    Check("with a KV cache, new tokens match a full forward", check_cache, HINT_PASS_CACHE),
    Check(f"its norms take the config's layer_norm_epsilon ({EPS})", check_layer_norm_epsilon, HINT_EPS),
]
