"""The solution's picture of each step that has one (what ``pixi run show NN --png``
draws on its right), computed with the numpy oracle instead of MAX.

The book puts one on every such step's page. ``checker/show.py`` gets the same
matrix by running the solution on MAX, which costs kernel compiles on a fresh
machine; the oracle gives it in milliseconds from the same inputs and the same
random weights (tests/test_docs.py checks that both agree).
"""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle, registry
from checker.show import SMALL, _ids, _solution_class, _x


def _weights(class_name: str, seed: int) -> dict[str, np.ndarray]:
    """The random weights show.py's ``_paired`` loads: their values depend on the
    order of the parameters, so read it from the solution's module (built lazily,
    no MAX kernel runs)."""
    from solutions.solution_01 import GPT2Config

    module = maxrun.build(_solution_class(class_name), GPT2Config(**SMALL))
    return maxrun.random_weights(maxrun.parameter_shapes(module), seed=seed)


def _head_0_attention(class_name: str, seed: int) -> np.ndarray:
    w = _weights(class_name, seed)
    x = _x((1, 5, SMALL["n_embd"]), seed)
    q, k, _ = np.split(oracle.linear(x, w["c_attn.weight"], w["c_attn.bias"]), 3, axis=-1)
    q, k = (oracle.split_heads(t, SMALL["n_head"]) for t in (q, k))
    scores = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + oracle.causal_mask(5)
    return oracle.softmax(scores)[0, 0].astype(np.float32)


def step_02() -> np.ndarray:
    return oracle.causal_mask(4, 2)


def step_05() -> np.ndarray:
    return maxrun.random_weights({"weight": [SMALL["vocab_size"], 8]}, seed=5)["weight"][_ids(6)[0]]


def step_06() -> np.ndarray:
    return maxrun.random_weights({"weight": [SMALL["n_positions"], 8]}, seed=6)["weight"][2:7]


def step_07() -> np.ndarray:
    return _head_0_attention("GPT2MultiHeadAttention", 7)


def step_11() -> np.ndarray:
    logits, _ = oracle.lm_logits(_ids(), _weights("GPT2LMHeadModel", 11), SMALL["n_head"])
    return logits[0]


def step_15() -> np.ndarray:
    return _head_0_attention("GPT2AttentionWithWeights", 15)


def pictures() -> dict:
    """Step -> (the solution's matrix, its name) for every step checker/registry.py names a picture for."""
    # A row naming a picture without a step_NN here is left out (tests/test_registry.py names it).
    drawn = {s.number: (globals().get(f"step_{s.number}"), s.picture) for s in registry.STEPS if s.picture}
    return {number: entry for number, entry in drawn.items() if entry[0] is not None}


PICTURES = pictures()
