"""Checks for step 05: token embeddings (wte)."""

from __future__ import annotations

import numpy as np

from checker import maxrun
from checker.harness import Check, StepContext, compare

USES_MAX = True
VOCAB, DIM = 101, 48


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(
        ctx, "TokenEmbedding", "one table `weight` of shape [vocab_size, n_embd]: a row per token id", VOCAB, DIM)


def _ids(batch: int, seq: int, seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(0, VOCAB, size=(batch, seq))
    ids.flat[0], ids.flat[-1] = 0, VOCAB - 1  # the first and last rows of the table
    return ids.astype(np.int64)


def check_lookup(ctx: StepContext) -> None:
    weights = maxrun.random_weights({"weight": [VOCAB, DIM]}, seed=5)
    learner = maxrun.build(ctx.learner.TokenEmbedding, VOCAB, DIM, weights=weights)
    table = weights["weight"]
    for i, (batch, seq) in enumerate(maxrun.SHAPES):
        ids = _ids(batch, seq, i)
        compare(
            maxrun.run(learner, ids), table[ids], f"TokenEmbedding on ids of shape {[batch, seq]}",
            "gather rows of the table: F.gather(self.weight, ids, axis=0)",
            lambda: {
                "GPT-2 does not scale embeddings by sqrt(n_embd) (the 2017 Transformer did)":
                    (table[ids] * np.sqrt(DIM)).astype(np.float32),
                "token ids start at 0: row ids[b, t] of the table, no shift":
                    table[np.clip(ids - 1, 0, None)],
            },
        )


CHECKS = [
    Check("parameter `weight` of shape [vocab_size, n_embd]", check_parameters,
          "self.weight = random.normal([vocab_size, n_embd])"),
    Check("looks up rows: batch 1-2, lengths 1, 7, 70, first and last ids", check_lookup,
          "F.gather(self.weight, ids, axis=0)"),
]
