"""Checks for step 04: gelu_new and GPT2MLP."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, StepContext, compare

USES_MAX = True
CONFIG = maxrun.SMALL_CONFIG


def _gelu_mistakes(x: np.ndarray) -> dict[str, np.ndarray]:
    x64 = x.astype(np.float64)
    return {
        "GPT-2 uses the tanh approximation (gelu_new), not the exact erf GELU": oracle.gelu_exact(x),
        "that is ReLU; GPT-2 uses GELU's tanh approximation": np.maximum(x, 0).astype(np.float32),
        "the cubic term's constant is 0.044715": oracle.gelu_new(x, c=0.44715),
        "gelu_new starts with 0.5 * x * (...)": oracle.gelu_new(x, half=1.0),
        "that is the sigmoid approximation x * sigmoid(1.702 x); GPT-2 uses the tanh one":
            (x64 / (1 + np.exp(-1.702 * x64))).astype(np.float32),
    }


def check_gelu(ctx: StepContext) -> None:
    x = np.linspace(-6, 6, 97, dtype=np.float32).reshape(1, 97)
    got = maxrun.lazily(ctx.learner.gelu_new, maxrun.tensor(x), what="gelu_new")
    compare(got, oracle.gelu_new(x), "gelu_new on -6..6",
            "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))", lambda: _gelu_mistakes(x))


def check_parameters(ctx: StepContext) -> None:
    maxrun.check_same_parameters(
        ctx, "GPT2MLP", "c_fc = Linear(n_embd, 4 * n_embd), c_proj = Linear(4 * n_embd, n_embd), both with bias")


def _mlp_mistakes(x, w):
    return {
        "the activation must be gelu_new (tanh approximation), not the exact GELU":
            oracle.mlp(x, w, activation=oracle.gelu_exact),
        "apply gelu_new between c_fc and c_proj":
            oracle.mlp(x, w, activation=lambda h: h),
        "that is ReLU; apply gelu_new between c_fc and c_proj":
            oracle.mlp(x, w, activation=lambda h: np.maximum(h, 0)),
    }


def check_forward(ctx: StepContext) -> None:
    learner, solution, weights = maxrun.paired_modules(ctx, "GPT2MLP", seed=4)
    rng = np.random.default_rng(4)
    for batch, seq in maxrun.SHAPES:
        x = rng.standard_normal((batch, seq, CONFIG["n_embd"])).astype(np.float32)
        compare(maxrun.run(learner, x), maxrun.run(solution, x), f"GPT2MLP on x of shape {list(x.shape)}",
                "c_proj(gelu_new(c_fc(x)))", lambda: _mlp_mistakes(x, weights))


CHECKS = [
    Check("gelu_new is GELU's tanh approximation", check_gelu,
          "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))"),
    Check("parameters c_fc and c_proj with Hugging Face's names and shapes", check_parameters,
          "c_fc = Linear(n_embd, 4 * n_embd), c_proj = Linear(4 * n_embd, n_embd)"),
    Check("matches the solution at batch 1-2, lengths 1, 7, 70", check_forward, "c_proj(gelu_new(c_fc(x)))"),
]
