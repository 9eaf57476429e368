"""Checks for step 02: the causal mask, plain and offset (KV cache) forms."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, CheckFailed, StepContext, assert_close, close, describe_exception

USES_MAX = True

MISTAKES = {
    "hides the diagonal": (
        dict(include_diagonal=False),
        "a token must see itself: hide key j only when j > past_len + i (use >, not >=)",
    ),
    "ignores the offset": (
        dict(use_offset=False),
        "query row i is the token at position past_len + i: add past_len to the query positions",
    ),
}


def _mask(ctx: StepContext, seq_len: int, past_len: int) -> np.ndarray:
    return maxrun.lazily(ctx.learner.causal_mask, seq_len, past_len, what=f"causal_mask({seq_len}, {past_len})")


def _compare(ctx: StepContext, seq_len: int, past_len: int) -> None:
    got = _mask(ctx, seq_len, past_len)
    expected = oracle.causal_mask(seq_len, past_len)
    what = f"causal_mask({seq_len}, past_len={past_len})"
    if close(got, expected) and got.dtype == expected.dtype:
        return
    if got.shape == expected.shape:
        for kwargs, hint in MISTAKES.values():
            if close(got, oracle.causal_mask(seq_len, past_len, **kwargs)):
                raise CheckFailed(f"{what} is wrong", hint)
        if close(got, np.where(expected == 0, -np.inf, 0).astype(np.float32)):
            raise CheckFailed(f"{what} is inverted",
                              "visible entries are 0 and hidden ones -inf, not the other way round")
        if np.isfinite(got).all():
            raise CheckFailed(
                f"{what} has no -inf entries",
                "hidden entries must be float('-inf') (exp(-inf) = 0 after softmax); visible ones 0",
            )
    assert_close(got, expected, what, hint="compare with the pictures in the step: 0 visible, -inf hidden")


def check_shape(ctx: StepContext) -> None:
    for seq_len, past_len in ((3, 0), (2, 5)):
        got = _mask(ctx, seq_len, past_len)
        if list(got.shape) != [seq_len, past_len + seq_len]:
            raise CheckFailed(
                f"causal_mask({seq_len}, {past_len}) has shape {list(got.shape)}, "
                f"expected {[seq_len, past_len + seq_len]}",
                "one row per new (query) token, one column per key: past_len + seq_len",
            )
        if got.dtype != np.float32:
            raise CheckFailed(f"causal_mask has dtype {got.dtype}, expected float32",
                              "pass dtype= when you build the values")


def check_plain(ctx: StepContext) -> None:
    for seq_len in (4, 1, 70):  # 4 first: at 1x1 several mistakes look alike
        _compare(ctx, seq_len, 0)


def check_default(ctx: StepContext) -> None:
    # Called as the model calls it without a cache: past_len left at its default.
    got = maxrun.lazily(ctx.learner.causal_mask, 3, what="causal_mask(3)")
    if got.shape != (3, 3) or not close(got, _mask(ctx, 3, 0)):
        raise CheckFailed(f"causal_mask(3) (past_len left out) has shape {list(got.shape)} and differs from "
                          "causal_mask(3, 0)", "past_len defaults to 0: no cached positions")


def check_offset(ctx: StepContext) -> None:
    for seq_len, past_len in ((1, 5), (3, 2), (70, 7)):
        _compare(ctx, seq_len, past_len)


def check_symbolic(ctx: StepContext) -> None:
    """Inside the compiled model the lengths are the input's symbolic
    dimensions (Dim('seq')), not ints: the mask must be built from them.
    Traced only (milliseconds), as Module.compile traces it."""
    from max.dtype import DType
    from max.experimental import compilation, nn
    from max.graph import DeviceRef, TensorType

    class Probe(nn.Module):
        def forward(self, x):
            return ctx.learner.causal_mask(x.shape[1], x.shape[0])

    try:
        with maxrun.interpreter():
            compilation.stage(Probe())(TensorType(DType.float32, ["past", "seq"], device=DeviceRef.CPU()))
    except Exception as exc:  # reported as the other checks report the learner's errors
        message, hint = describe_exception(exc, ctx.learner_path)
        if "Dim(" in str(exc) or "static dim" in str(exc):  # a length used as a number
            hint = ("in the compiled model the lengths are symbolic dimensions, not ints: int(), range() or numpy "
                    "on them fails. Build the mask with tensor ops on them: Tensor.arange for the positions, "
                    "F.greater to compare, F.where to pick -inf or 0")
        raise CheckFailed(f"causal_mask(Dim('seq'), Dim('past')) fails to trace:\n{message}", hint) from None


CHECKS = [
    Check("shape [seq_len, past_len + seq_len], float32", check_shape,
          "one row per query, one column per key"),
    Check("no past: lengths 4, 1, 70", check_plain, "key j is visible to query i iff j <= i"),
    Check("with past positions (KV cache): (1, 5), (3, 2), (70, 7)", check_offset,
          "key j is visible to query i iff j <= past_len + i"),
    Check("past_len defaults to 0", check_default, "def causal_mask(seq_len, past_len=0, ...)"),
    Check("symbolic lengths, as in the compiled model", check_symbolic,
          "build the mask from tensor ops (arange, compare, where), never int() of a length"),
]
