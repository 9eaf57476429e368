"""Checks for step 11: GPT2LMHeadModel with the tied head."""

from __future__ import annotations

import numpy as np

from checker import maxrun
from checker.checks.step_10 import call
from checker.harness import Check, CheckFailed, StepContext, compare

TITLE = "the language-model head"
USES_MAX = True
CONFIG = maxrun.SMALL_CONFIG


def _modules(ctx: StepContext):
    return maxrun.paired_modules(ctx, "GPT2LMHeadModel", seed=11)


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(
        ctx, "GPT2LMHeadModel",
        "self.transformer = GPT2Model(config); the head reuses transformer.wte.weight, so it has no weight of its own")


def check_logits(ctx: StepContext) -> None:
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(110)
    for batch, seq in maxrun.SHAPES:
        ids = rng.integers(0, CONFIG["vocab_size"], size=(batch, seq)).astype(np.int64)
        got = call(learner, ids)
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckFailed("forward must return (logits, cache)", "return self.lm_head(hidden), present")
        expected = call(solution, ids)
        compare(got[0], expected[0], f"logits for ids of shape {[batch, seq]}",
                "logits = hidden @ transformer.wte.weight^T, no bias (this step runs your steps 01-10)")


def check_last_only(ctx: StepContext) -> None:
    learner, solution, _ = _modules(ctx)
    ids = np.random.default_rng(111).integers(0, CONFIG["vocab_size"], size=(2, 7)).astype(np.int64)
    full = call(solution, ids)[0]
    got = maxrun.lazily(learner, maxrun.tensor(ids), None, last_only=True, what="forward(last_only=True)")
    compare(got[0], full[:, -1:], "forward(ids, last_only=True)",
            "keep only the last position, hidden[:, seq - 1:, :], before the head (shape [batch, 1, vocab])",
            lambda: {"last_only keeps the *last* position, not the first": full[:, :1]})


def check_cache(ctx: StepContext) -> None:
    learner, solution, _ = _modules(ctx)
    ids = np.random.default_rng(112).integers(0, CONFIG["vocab_size"], size=(1, 9)).astype(np.int64)
    full = call(solution, ids)[0]
    _, past = call(solution, ids[:, :-1])
    got = call(learner, ids[:, -1:], past)
    compare(got[0], full[:, -1:], "logits of 1 new token after 8 cached", "pass past on to self.transformer")


CHECKS = [
    Check("transformer.* parameters only (the head is tied to wte)", check_parameters,
          "self.transformer = GPT2Model(config)"),
    Check("logits match the solution at batch 1-2, lengths 1, 7, 70", check_logits,
          "logits = hidden @ transformer.wte.weight^T"),
    Check("last_only=True scores just the last position", check_last_only, "hidden[:, seq - 1:, :]"),
    Check("with a KV cache, the new token's logits match a full forward", check_cache,
          "pass past on to self.transformer"),
]
