"""GPT-2's math in plain numpy, independent of MAX (in the spirit of picoGPT).

The tests use it as the reference the solutions must agree with, and the step
checks use its knobs (``ddof``, ``eps``, ...) to recognise typical mistakes: if
a learner's output equals the oracle run with a known wrong knob, the check
can name the mistake instead of printing two arrays.

Everything computes in float64 and returns float32.
"""

from __future__ import annotations

import numpy as np


def causal_mask(seq_len: int, past_len: int = 0, *, include_diagonal: bool = True,
                use_offset: bool = True) -> np.ndarray:
    """Additive mask [seq_len, past_len + seq_len]: 0 visible, -inf hidden."""
    query = np.arange(seq_len)[:, None] + (past_len if use_offset else 0)
    key = np.arange(past_len + seq_len)[None, :]
    hidden = key >= query if not include_diagonal else key > query
    return np.where(hidden, -np.inf, 0.0).astype(np.float32)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5,
               *, ddof: int = 0, eps_inside_sqrt: bool = True) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True, ddof=ddof)
    denominator = np.sqrt(var + eps) if eps_inside_sqrt else np.sqrt(var) + eps
    return ((x - mean) / denominator * weight + bias).astype(np.float32)
