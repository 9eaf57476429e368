"""Checks for bonus step 16: causal self-attention with RoPE."""

from __future__ import annotations

import numpy as np

from checker import maxrun
from checker import oracle_attention as oa
from checker.harness import Check, CheckFailed, StepContext, compare

USES_MAX = True
D_MODEL, HEADS = 32, 4
HEAD_DIM = D_MODEL // HEADS

HINT_INTERLEAVED = ("this course pairs dimension i with i + d/2 (rotate_half); yours pairs neighbours 2i, 2i+1 "
                    "(Meta's layout)")
HINT_ROTATE_V = "rotate q and k only: values carry no position"
HINT_ROTATE_Q = "rotate both q and k, with the same positions"
HINT_NO_MASK = "add the causal mask (step 02) to the scores before the softmax"
HINT_FREQ = "the frequencies use the head width: theta ** (-2i / head_dim), not d_model"
HINT_THETA = "theta is 10000"


def _modules(ctx: StepContext):
    key = "rotary"
    if key not in ctx.cache:
        solution = maxrun.build(ctx.solution.RotaryCausalSelfAttention, D_MODEL, HEADS)
        weights = maxrun.random_weights(maxrun.parameter_shapes(solution), seed=16)
        solution.load_state_dict(weights)
        learner = maxrun.build(ctx.learner.RotaryCausalSelfAttention, D_MODEL, HEADS, weights=weights)
        ctx.cache[key] = learner, weights
    return ctx.cache[key]


def _positions(start: int, seq: int) -> np.ndarray:
    return np.arange(start, start + seq, dtype=np.int64)


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(ctx, "RotaryCausalSelfAttention",
                                 "q_proj, k_proj, v_proj, out_proj = Linear(d_model, d_model, bias=False)",
                                 D_MODEL, HEADS)


def check_rotate_half(ctx: StepContext) -> None:
    x = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)
    got = maxrun.lazily(ctx.learner.rotate_half, maxrun.tensor(x), what="rotate_half")
    compare(got, np.concatenate([-x[..., 4:], x[..., :4]], -1), "rotate_half on [..., 8]",
            "concat(-second half, first half) along the last axis",
            lambda: {"negate the *second* half and put it first": np.concatenate([x[..., 4:], -x[..., :4]], -1)})


def check_cos_sin(ctx: StepContext) -> None:
    for start, seq in ((0, 5), (100, 3)):
        positions = _positions(start, seq)
        got = maxrun.lazily(ctx.learner.rope_cos_sin, maxrun.tensor(positions), HEAD_DIM, what="rope_cos_sin")
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckFailed("rope_cos_sin must return (cos, sin)", "return F.cos(angles), F.sin(angles)")
        inv_freq = 10000.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
        angles = np.tile(positions[:, None] * inv_freq[None, :], 2)
        what = f"rope_cos_sin(positions {start}..{start + seq - 1}, head_dim {HEAD_DIM})"
        hint = "angle[p, i] = p * 10000 ** (-2i / head_dim), repeated: [a_0 .. a_{d/2-1}, a_0 .. a_{d/2-1}]"
        if start and np.allclose(got[0], np.cos(np.tile(np.arange(seq)[:, None] * inv_freq, 2)), atol=1e-4):
            raise CheckFailed(f"{what}: the angles start at 0", "use the positions you are given, not arange(seq)")
        compare(got[0], np.cos(angles).astype(np.float32), what + " cos", hint)
        compare(got[1], np.sin(angles).astype(np.float32), what + " sin", hint)


def _mistakes(x, w, positions):
    def variant(**knobs):
        return oa.rotary_attention(x, w, HEADS, positions, **knobs)

    return {HINT_INTERLEAVED: variant(interleaved=True), HINT_ROTATE_V: variant(rotate="qkv"),
            HINT_ROTATE_Q: variant(rotate="q"), HINT_NO_MASK: variant(causal=False),
            HINT_FREQ: variant(freq_width=D_MODEL), HINT_THETA: variant(theta=100000.0)}


def check_forward(ctx: StepContext) -> None:
    learner, w = _modules(ctx)
    rng = np.random.default_rng(160)
    for (batch, seq), start in zip(maxrun.SHAPES, (0, 5, 300)):
        x = rng.standard_normal((batch, seq, D_MODEL)).astype(np.float32)
        positions = _positions(start, seq)
        got = maxrun.run(learner, x, positions)
        compare(got, oa.rotary_attention(x, w, HEADS, positions),
                f"x {[batch, seq, D_MODEL]} at positions {start}..{start + seq - 1}",
                "project, rotate q and k, causal attention, merge, out_proj", lambda: _mistakes(x, w, positions))


def check_relative(ctx: StepContext) -> None:
    # RoPE's point: scores depend on m - n only, so shifting every position
    # by the same amount leaves the output unchanged.
    learner, _ = _modules(ctx)
    x = np.random.default_rng(161).standard_normal((1, 6, D_MODEL)).astype(np.float32)
    at_0 = maxrun.run(learner, x, _positions(0, 6))
    at_40 = maxrun.run(learner, x, _positions(40, 6))
    compare(at_40, at_0, "the same tokens at positions 40..45 and at 0..5",
            "rotate q and k by the same positions (and not v): then only m - n matters")


CHECKS = [
    Check("parameters q_proj, k_proj, v_proj, out_proj [d_model, d_model], no bias", check_parameters,
          "four Linear(d_model, d_model, bias=False)"),
    Check("rotate_half", check_rotate_half, "concat(-x2, x1)"),
    Check("rope_cos_sin at positions from 0 and from 100", check_cos_sin, "p * theta ** (-2i / head_dim)"),
    Check("forward matches the numpy oracle at start positions 0, 5, 300", check_forward,
          "q, k rotated; causal softmax; out_proj"),
    Check("shifting all positions leaves the output unchanged", check_relative, "rotate q and k only"),
]
