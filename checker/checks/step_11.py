"""Checks for step 11: GPT2LMHeadModel with the tied head."""

from __future__ import annotations

import numpy as np

from checker import maxrun
from checker.checks.step_10 import call
from checker.harness import Check, CheckFailed, StepContext, compare

USES_MAX = True
CONFIG = maxrun.SMALL_CONFIG


def _modules(ctx: StepContext):
    return maxrun.paired_modules(ctx, "GPT2LMHeadModel", seed=11)


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(
        ctx, "GPT2LMHeadModel",
        "self.transformer = GPT2Model(config, linear, attention); "
        "self.lm_head = linear(config.n_embd, config.vocab_size, bias=False)")


def check_logits(ctx: StepContext) -> None:
    # The checks load lm_head.weight and wte with different random values, so
    # that a head reading wte directly shows (a loaded checkpoint ties them).
    learner, solution, weights = _modules(ctx)
    rng = np.random.default_rng(110)
    for batch, seq in maxrun.SHAPES:
        ids = rng.integers(0, CONFIG["vocab_size"], size=(batch, seq)).astype(np.int64)
        what = f"logits for ids of shape {[batch, seq]}"
        got = maxrun.output_alone(maxrun.run(learner, ids), what, "end with `return self.lm_head(hidden)`")
        expected = maxrun.run(solution, ids)
        hidden = maxrun.run(solution.transformer, ids, what="transformer")
        compare(got, expected, what,
                "logits = self.lm_head(hidden) (this step runs your steps 01-10)",
                lambda: {"score with self.lm_head, not wte directly: the loader ties their weights, but the head "
                         "is its own module (the app may build it quantized)":
                         hidden @ weights["transformer.wte.weight"].T})


def check_positions(ctx: StepContext) -> None:
    learner, solution, _ = _modules(ctx)
    ids = np.random.default_rng(111).integers(0, CONFIG["vocab_size"], size=(2, 7)).astype(np.int64)
    full = maxrun.run(solution, ids)
    for positions in ([6], [0, 3, 6]):
        what = f"forward(ids, None, positions={positions})"
        try:
            got = maxrun.lazily(learner, maxrun.tensor(ids), None, maxrun.tensor(np.array(positions, dtype=np.int64)),
                                what=what)
        except ValueError as exc:  # raised by MAX when the lazy graph runs, not in the learner's file
            if "gather" not in str(exc):
                raise
            raise CheckFailed(f"{what} on ids of shape [2, 7]: {str(exc).splitlines()[-1]}",
                              "gather along axis 1, the sequence: F.gather(hidden, positions, axis=1)") from None
        compare(got, full[:, positions], f"forward(ids, positions={positions})",
                "hidden = F.gather(hidden, positions, axis=1) before the head: shape [batch, len(positions), vocab]",
                lambda: {"gather along axis 1 (the sequence), not axis 0 (the batch)": full[:, :len(positions)]})


HINT_PASS_CACHES = ("pass caches on to the transformer: self.transformer(ids, caches); if you do, run step 10's "
                    "checks")


def check_cache(ctx: StepContext) -> None:
    learner, solution, _ = _modules(ctx)
    ids = np.random.default_rng(112).integers(0, CONFIG["vocab_size"], size=(1, 9)).astype(np.int64)
    full = call(solution, ids)
    past = call(solution, ids[:, :-1])[1]
    got = call(learner, ids[:, -1:], past, empty=HINT_PASS_CACHES)
    compare(got[1][0][0], full[1][0][0], "the keys block 0's cache holds after 1 new token after 8 cached",
            HINT_PASS_CACHES)
    compare(got[0], full[0][:, -1:], "logits of 1 new token after 8 cached", HINT_PASS_CACHES)


CHECKS = [
    Check("transformer.* and lm_head.weight (no bias)", check_parameters,
          "self.lm_head = linear(config.n_embd, config.vocab_size, bias=False)"),
    Check("logits match the solution at batch 1-2, lengths 1, 7, 70", check_logits, "logits = self.lm_head(hidden)"),
    Check("positions scores just those positions", check_positions, "F.gather(hidden, positions, axis=1)"),
    Check("with a KV cache, the new token's logits match a full forward", check_cache, HINT_PASS_CACHES),
]
