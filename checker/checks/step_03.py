"""Checks for step 03: layer norm."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, CheckFailed, StepContext, compare

USES_MAX = True
DIM = 48


def _weights() -> dict[str, np.ndarray]:
    return maxrun.random_weights({"weight": [DIM], "bias": [DIM]}, seed=3)


def _inputs(batch: int, seq: int, scale: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # A non-zero mean, so forgetting to subtract it shows.
    return (0.5 + scale * rng.standard_normal((batch, seq, DIM))).astype(np.float32)


def _mistakes(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "the variance is biased: divide by n (x.mean of the squares), not n - 1 (no Bessel's correction)":
            oracle.layer_norm(x, w, b, ddof=1),
        "add eps = 1e-5 to the variance, sqrt(var + eps): it is missing (or far too small, like BERT's 1e-12)":
            oracle.layer_norm(x, w, b, eps=0.0),
        "eps belongs inside the square root: sqrt(var + eps), not sqrt(var) + eps":
            oracle.layer_norm(x, w, b, eps_inside_sqrt=False),
        "GPT-2's eps is 1e-5 (the default argument of LayerNorm)":
            oracle.layer_norm(x, w, b, eps=1e-6),
        "apply the learned bias: ... * weight + bias":
            oracle.layer_norm(x, w, np.zeros_like(b)),
        "apply the learned scale: ... * weight + bias":
            oracle.layer_norm(x, np.ones_like(w), b),
    }


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(ctx, "LayerNorm", "self.weight and self.bias, each of shape [dim]", DIM)


def check_initial_values(ctx: StepContext) -> None:
    with maxrun.interpreter():
        module = ctx.learner.LayerNorm(DIM)  # eager: the real initial values
        values = {name: t.to_numpy() for name, t in module.parameters}
    for name, expected in (("weight", 1.0), ("bias", 0.0)):
        got = values[name]
        if not np.all(got == expected):
            raise CheckFailed(
                f"a new LayerNorm's {name} is not all {expected:g}",
                "start as the identity: weight = Tensor.ones([dim]), bias = Tensor.zeros([dim])",
            )


def _compare(ctx: StepContext, scale: float, shapes) -> None:
    weights = _weights()
    learner = maxrun.build(ctx.learner.LayerNorm, DIM, weights=weights)
    solution = maxrun.build(ctx.solution.LayerNorm, DIM, weights=weights)
    for i, (batch, seq) in enumerate(shapes):
        x = _inputs(batch, seq, scale, seed=i)
        got = maxrun.run(learner, x)
        expected = maxrun.run(solution, x)
        compare(got, expected, f"LayerNorm on x of shape {[batch, seq, DIM]}",
                "y = (x - mean) / sqrt(var + eps) * weight + bias, over the last axis",
                lambda: _mistakes(x, weights["weight"], weights["bias"]))


def check_random(ctx: StepContext) -> None:
    _compare(ctx, scale=2.0, shapes=maxrun.SHAPES)


def check_small_variance(ctx: StepContext) -> None:
    # With var ~ 1e-6 the eps term dominates: this is where eps mistakes show.
    _compare(ctx, scale=1e-3, shapes=[(1, 5), (2, 3)])


EPS = maxrun.OTHER_EPS
HINT_EPS_ARGUMENT = (f"use the eps you are given: LayerNorm(dim, eps={EPS}) must add {EPS}, not 1e-5 (later steps "
                     "pass config.layer_norm_epsilon)")


def check_eps_argument(ctx: StepContext) -> None:
    # Steps 09 and 10 build their norms with config.layer_norm_epsilon: a norm that keeps
    # 1e-5 whatever it is given would pass here and be blamed there.
    weights = _weights()
    learner = maxrun.build(ctx.learner.LayerNorm, DIM, EPS, weights=weights)
    solution = maxrun.build(ctx.solution.LayerNorm, DIM, EPS, weights=weights)
    x = _inputs(1, 5, 1.0, seed=30)
    compare(maxrun.run(learner, x), maxrun.run(solution, x), f"LayerNorm(dim, eps={EPS})", HINT_EPS_ARGUMENT,
            lambda: {HINT_EPS_ARGUMENT: oracle.layer_norm(x, weights["weight"], weights["bias"])})


CHECKS = [
    Check("parameters `weight` and `bias` of shape [dim]", check_parameters,
          "self.weight and self.bias, each of shape [dim]"),
    Check("a new LayerNorm has weight 1 and bias 0", check_initial_values,
          "weight = Tensor.ones([dim]), bias = Tensor.zeros([dim])"),
    Check("matches the solution at batch 1-2, lengths 1, 7, 70", check_random,
          "y = (x - mean) / sqrt(var + eps) * weight + bias, over the last axis"),
    Check("matches where eps matters (variance ~ 1e-6)", check_small_variance,
          "eps = 1e-5 is added to the variance inside the square root"),
    Check(f"uses the eps it is given (eps={EPS})", check_eps_argument, HINT_EPS_ARGUMENT),
]
