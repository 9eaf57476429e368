"""Checks for step 09: GPT2Block."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, CheckFailed, StepContext, compare

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


def check_forward(ctx: StepContext) -> None:
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(90)
    for batch, seq in maxrun.SHAPES:
        x = rng.standard_normal((batch, seq, E)).astype(np.float32)
        got = maxrun.run(learner, x)
        if not isinstance(got, tuple) or len(got) != 3:
            raise CheckFailed("forward must return a tuple (x, keys, values)", "end with `return x, key, value`")
        expected = maxrun.run(solution, x)
        compare(got[0], expected[0], f"GPT2Block on x of shape {[batch, seq, E]}", USES,
                lambda: _mistakes(x, weights))
        compare(got[1], expected[1], "returned keys", "return the keys the attention gave back")
        compare(got[2], expected[2], "returned values", "return the values the attention gave back")


EPS = maxrun.OTHER_EPS
HINT_EPS = ("build ln_1 and ln_2 with eps=config.layer_norm_epsilon: LayerNorm's default (1e-5) ignores a "
            "checkpoint whose config says otherwise (or your step 03's LayerNorm ignores its eps: run its checks)")


def check_layer_norm_epsilon(ctx: StepContext) -> None:
    learner, solution, weights = maxrun.paired_modules(ctx, "GPT2Block", seed=9,
                                                       config=dict(CONFIG, layer_norm_epsilon=EPS))
    x = np.random.default_rng(92).standard_normal((1, 7, E)).astype(np.float32)
    got, expected = maxrun.run(learner, x), maxrun.run(solution, x)
    compare(got[0], expected[0], f"GPT2Block with layer_norm_epsilon = {EPS}", HINT_EPS,
            lambda: {HINT_EPS: oracle.block(x, weights, H)[0]})


def check_cache(ctx: StepContext) -> None:
    learner, solution, _ = _modules(ctx)
    x = np.random.default_rng(91).standard_normal((2, 10, E)).astype(np.float32)
    full = maxrun.run(solution, x)
    _, past_k, past_v = maxrun.run(solution, x[:, :-2])
    got = maxrun.run(learner, x[:, -2:], past_k, past_v)
    compare(got[0], full[0][:, -2:], "2 new tokens after 8 cached", "pass past_key and past_value on to self.attn")


CHECKS = [
    Check("children ln_1, attn, ln_2, mlp with Hugging Face's parameter names", check_parameters,
          "self.ln_1, self.attn, self.ln_2, self.mlp"),
    Check("matches the solution at batch 1-2, lengths 1, 7, 70", check_forward, USES),
    Check("with a KV cache, new tokens match a full forward", check_cache, "pass the cache to the attention"),
    Check(f"its norms take the config's layer_norm_epsilon ({EPS})", check_layer_norm_epsilon, HINT_EPS),
]
