"""Checks for step 08: the pre-LN residual wiring."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, StepContext, compare

USES_MAX = True
E = 48


def check_wiring(ctx: StepContext) -> None:
    # A real norm and a real MLP from the solutions, so only the wiring varies.
    from solutions.solution_01 import GPT2Config
    from solutions.solution_03 import LayerNorm
    from solutions.solution_04 import GPT2MLP

    config = GPT2Config(vocab_size=101, n_positions=96, n_embd=E, n_layer=1, n_head=4)
    ln_w = maxrun.random_weights({"weight": [E], "bias": [E]}, seed=8)
    norm = maxrun.build(LayerNorm, E, weights=ln_w)
    mlp_module = maxrun.build(GPT2MLP, config)
    mlp_w = maxrun.random_weights(maxrun.parameter_shapes(mlp_module), seed=80)
    mlp_module.load_state_dict(mlp_w)

    def ln(h):
        return oracle.layer_norm(h, ln_w["weight"], ln_w["bias"])

    def mlp(h):
        return oracle.mlp(h, mlp_w)

    rng = np.random.default_rng(8)
    for batch, seq in maxrun.SHAPES:
        x = (0.5 + rng.standard_normal((batch, seq, E))).astype(np.float32)
        got = maxrun.lazily(ctx.learner.pre_norm_residual, maxrun.tensor(x), norm, mlp_module, what="pre_norm_residual")
        compare(got, (x + mlp(ln(x))).astype(np.float32), f"pre_norm_residual on x of shape {list(x.shape)}",
                "return x + sublayer(norm(x))",
                lambda: {
                    "that is post-LN (2017): GPT-2 normalises the sub-layer's input, x + sublayer(norm(x))":
                        ln(x + mlp(x)),
                    "add the residual: x + sublayer(norm(x)), not sublayer(norm(x)) alone": mlp(ln(x)),
                    "the residual adds the *raw* x, not norm(x): x + sublayer(norm(x))":
                        (ln(x) + mlp(ln(x))).astype(np.float32),
                    "normalise the sub-layer's input, not its output: x + sublayer(norm(x))":
                        (x + ln(mlp(x))).astype(np.float32),
                    "apply norm before the sub-layer: x + sublayer(norm(x))": (x + mlp(x)).astype(np.float32),
                })


CHECKS = [
    Check("x + sublayer(norm(x)) with GPT-2's layer norm and MLP", check_wiring, "return x + sublayer(norm(x))"),
]
