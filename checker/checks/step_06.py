"""Checks for step 06: position embeddings (wpe), with an offset for the cache."""

from __future__ import annotations

import numpy as np

from checker import maxrun
from checker.harness import Check, CheckFailed, StepContext, compare

USES_MAX = True
POSITIONS, DIM = 96, 48


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(
        ctx, "PositionEmbedding", "one table `weight` of shape [n_positions, n_embd]: a row per position",
        POSITIONS, DIM)


def _compare(ctx: StepContext, cases) -> None:
    weights = maxrun.random_weights({"weight": [POSITIONS, DIM]}, seed=6)
    table = weights["weight"]
    learner = maxrun.build(ctx.learner.PositionEmbedding, POSITIONS, DIM, weights=weights)
    for seq, past in cases:
        got = maxrun.lazily(learner, seq, past, what="PositionEmbedding.forward")
        wanted = table[past:past + seq]

        def mistakes():
            known = {
                "positions start at 0 (plus past_len), not 1": table[past + 1:past + seq + 1],
                "the first new token sits at position past_len: add past_len to the positions": table[:seq],
                "positions count up: past_len, past_len + 1, ...": table[past:past + seq][::-1],
            }
            return {hint: value for hint, value in known.items() if value.shape == wanted.shape}

        compare(got, wanted, f"PositionEmbedding(seq_len={seq}, past_len={past})",
                "rows past_len .. past_len + seq_len - 1 of the table", mistakes)


def check_plain(ctx: StepContext) -> None:
    _compare(ctx, [(1, 0), (7, 0), (70, 0)])


def check_offset(ctx: StepContext) -> None:
    _compare(ctx, [(1, 5), (3, 2), (70, 7), (4, POSITIONS - 4)])


def check_broadcast(ctx: StepContext) -> None:
    # The model adds positions [seq, n_embd] to tokens [batch, seq, n_embd].
    weights = maxrun.random_weights({"weight": [POSITIONS, DIM]}, seed=6)
    learner = maxrun.build(ctx.learner.PositionEmbedding, POSITIONS, DIM, weights=weights)
    got = maxrun.lazily(learner, 5, 0, what="PositionEmbedding.forward")
    if got.shape != (5, DIM):
        raise CheckFailed(f"PositionEmbedding(5) has shape {list(got.shape)}, expected {[5, DIM]}",
                          "return [seq_len, n_embd]; it broadcasts over the batch")


def check_default(ctx: StepContext) -> None:
    # past_len left at its default, as a call without a cache makes it.
    weights = maxrun.random_weights({"weight": [POSITIONS, DIM]}, seed=6)
    learner = maxrun.build(ctx.learner.PositionEmbedding, POSITIONS, DIM, weights=weights)
    got = maxrun.lazily(learner, 5, what="PositionEmbedding.forward(5)")
    if got.shape != (5, DIM) or not np.allclose(got, maxrun.lazily(learner, 5, 0, what="forward(5, 0)")):
        raise CheckFailed("PositionEmbedding.forward(5) (past_len left out) differs from forward(5, past_len=0)",
                          "past_len defaults to 0: no cached positions")


CHECKS = [
    Check("parameter `weight` of shape [n_positions, n_embd]", check_parameters,
          "self.weight = random.normal([n_positions, n_embd])"),
    Check("shape [seq_len, n_embd]", check_broadcast, "return [seq_len, n_embd]"),
    Check("positions from 0: lengths 1, 7, 70", check_plain, "rows 0 .. seq_len - 1 of the table"),
    Check("positions after a cache: (1, 5), (3, 2), (70, 7), up to the last position", check_offset,
          "rows past_len .. past_len + seq_len - 1"),
    Check("past_len defaults to 0", check_default, "def forward(self, seq_len, past_len=0)"),
]
