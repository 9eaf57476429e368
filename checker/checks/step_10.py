"""Checks for step 10: GPT2Model."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, CheckFailed, StepContext, compare

USES_MAX = True
CONFIG = maxrun.SMALL_CONFIG
H = CONFIG["n_head"]
USES = "this step runs your steps 03, 05, 06 and 09 (and what they use): make sure their checks pass"


def _modules(ctx: StepContext):
    return maxrun.paired_modules(ctx, "GPT2Model", seed=10)


def call(module, ids: np.ndarray, past=None):
    """Run a model on numpy ids and an optional numpy cache; numpy out."""
    if past is not None:
        past = [(maxrun.tensor(k), maxrun.tensor(v)) for k, v in past]
    return maxrun.lazily(module, maxrun.tensor(ids), past)


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(
        ctx, "GPT2Model", "wte, wpe, h (an nn.ModuleList of n_layer GPT2Blocks: h.0, h.1, ...) and ln_f")


def check_forward(ctx: StepContext) -> None:
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(100)
    for batch, seq in maxrun.SHAPES:
        ids = rng.integers(0, CONFIG["vocab_size"], size=(batch, seq)).astype(np.int64)
        got = call(learner, ids)
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckFailed("forward must return (hidden, cache)", "end with `return self.ln_f(x), present`")
        expected = call(solution, ids)
        compare(got[0], expected[0], f"GPT2Model on ids of shape {[batch, seq]}", USES, lambda: {
            "apply the final layer norm ln_f after the last block": oracle.gpt2(ids, weights, H, final_norm=False)[0],
            "add the position embeddings: x = wte(ids) + wpe(seq_len, past_len)":
                oracle.gpt2(ids, weights, H, positions=False)[0],
        })
        if len(got[1]) != CONFIG["n_layer"]:
            raise CheckFailed(f"the cache has {len(got[1])} entries, expected one (key, value) per block",
                              "append (key, value) from every block")
        for i, ((k, v), (ek, ev)) in enumerate(zip(got[1], expected[1])):
            compare(k, ek, f"cached keys of block {i}", "append each block's (key, value) in order")
            compare(v, ev, f"cached values of block {i}", "append each block's (key, value) in order")


EPS = maxrun.OTHER_EPS
HINT_EPS = ("build ln_f with eps=config.layer_norm_epsilon: LayerNorm's default (1e-5) ignores a checkpoint "
            "whose config says otherwise (or your step 03's LayerNorm ignores its eps: run its checks)")


def check_layer_norm_epsilon(ctx: StepContext) -> None:
    learner, solution, weights = maxrun.paired_modules(ctx, "GPT2Model", seed=10,
                                                       config=dict(CONFIG, layer_norm_epsilon=EPS))
    ids = np.random.default_rng(102).integers(0, CONFIG["vocab_size"], size=(1, 7)).astype(np.int64)
    got, expected = call(learner, ids), call(solution, ids)
    compare(got[0], expected[0], f"GPT2Model with layer_norm_epsilon = {EPS}", HINT_EPS, lambda: {
        HINT_EPS: oracle.gpt2(ids, weights, H, eps=EPS, final_eps=1e-5)[0],
        "your step 09's blocks ignore config.layer_norm_epsilon: run its checks":
            oracle.gpt2(ids, weights, H, eps=1e-5, final_eps=EPS)[0],
    })


def check_cache(ctx: StepContext) -> None:
    learner, solution, weights = _modules(ctx)
    ids = np.random.default_rng(101).integers(0, CONFIG["vocab_size"], size=(2, 12)).astype(np.int64)
    full = call(solution, ids)
    _, past = call(solution, ids[:, :-3])
    got = call(learner, ids[:, -3:], past)
    np_past = [(k, v) for k, v in past]
    compare(got[0], full[0][:, -3:], "3 new tokens after 9 cached",
            "pass each block its own cached (key, value), and start positions at past_len",
            lambda: {"the new tokens' positions start at past_len = past[0][0].shape[2], not 0":
                     oracle.gpt2(ids[:, -3:], weights, H, past=np_past, offset_positions=False)[0]})


CHECKS = [
    Check("wte, wpe, h.0..h.N, ln_f with Hugging Face's parameter names", check_parameters,
          "self.wte, self.wpe, self.h = nn.ModuleList([...]), self.ln_f"),
    Check("matches the solution at batch 1-2, lengths 1, 7, 70", check_forward, USES),
    Check("with a KV cache, new tokens match a full forward", check_cache, "positions start at past_len"),
    Check(f"ln_f takes the config's layer_norm_epsilon ({EPS})", check_layer_norm_epsilon, HINT_EPS),
]
