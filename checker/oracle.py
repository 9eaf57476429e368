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


def gelu_new(x: np.ndarray, *, c: float = 0.044715, half: float = 0.5) -> np.ndarray:
    """GPT-2's GELU (tanh approximation)."""
    x = x.astype(np.float64)
    return (half * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + c * x**3)))).astype(np.float32)


def gelu_exact(x: np.ndarray) -> np.ndarray:
    """The erf form of GELU (not GPT-2's): used to recognise that mistake."""
    from math import erf

    x = x.astype(np.float64)
    return (0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))).astype(np.float32)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``x @ weight.T + bias`` with MAX/PyTorch's [out, in] weight layout."""
    y = x.astype(np.float64) @ weight.astype(np.float64).T
    return (y if bias is None else y + bias).astype(np.float32)


def mlp(x: np.ndarray, w: dict[str, np.ndarray], prefix: str = "", activation=gelu_new) -> np.ndarray:
    h = activation(linear(x, w[prefix + "c_fc.weight"], w[prefix + "c_fc.bias"]))
    return linear(h, w[prefix + "c_proj.weight"], w[prefix + "c_proj.bias"])


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def split_heads(x: np.ndarray, n_head: int, *, transpose: bool = True) -> np.ndarray:
    """[b, t, h*d] -> [b, h, t, d] (``transpose=False``: the wrong reshape)."""
    b, t, e = x.shape
    if not transpose:
        return x.reshape(b, n_head, t, e // n_head)
    return x.reshape(b, t, n_head, e // n_head).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray, *, transpose: bool = True) -> np.ndarray:
    """[b, h, t, d] -> [b, t, h*d] (``transpose=False``: the wrong reshape)."""
    b, h, t, d = x.shape
    if not transpose:
        return x.reshape(b, t, h * d)
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, *,
           scale: float | None = None, mask_after_softmax: bool = False,
           softmax_axis: int = -1) -> np.ndarray:
    """softmax(q k^T * scale + mask) v over [..., t, d] arrays (default scale 1/sqrt(d))."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) * scale
    if mask is not None and not mask_after_softmax:
        scores = scores + mask
    weights = softmax(scores, axis=softmax_axis)
    if mask is not None and mask_after_softmax:
        weights = weights + mask
    with np.errstate(invalid="ignore"):
        return (weights @ v.astype(np.float64)).astype(np.float32)


def attention(x: np.ndarray, w: dict[str, np.ndarray], n_head: int, prefix: str = "",
              past: tuple[np.ndarray, np.ndarray] | None = None, *, order: str = "qkv",
              split_transpose: bool = True, merge_transpose: bool = True, causal: bool = True,
              project: bool = True, **attend_knobs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPT-2 attention: (output, keys, values); keys/values include ``past``
    (``project=False``: the merged heads without c_proj, a known mistake)."""
    qkv = linear(x, w[prefix + "c_attn.weight"], w[prefix + "c_attn.bias"])
    parts = dict(zip(order, np.split(qkv, 3, axis=-1)))
    q, k, v = (split_heads(parts[c], n_head, transpose=split_transpose) for c in "qkv")
    if past is not None:
        k = np.concatenate([past[0], k], axis=2)
        v = np.concatenate([past[1], v], axis=2)
    t = x.shape[1]
    mask = causal_mask(t, k.shape[2] - t) if causal else None
    out = merge_heads(attend(q, k, v, mask, **attend_knobs), transpose=merge_transpose)
    if not project:
        return out, k, v
    return linear(out, w[prefix + "c_proj.weight"], w[prefix + "c_proj.bias"]), k, v


def block(x: np.ndarray, w: dict[str, np.ndarray], n_head: int, prefix: str = "",
          past: tuple[np.ndarray, np.ndarray] | None = None, eps: float = 1e-5, *,
          wiring: str = "pre_ln") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One GPT-2 block; ``wiring`` names known mistakes for the checks."""
    def ln(name, h):
        return layer_norm(h, w[f"{prefix}{name}.weight"], w[f"{prefix}{name}.bias"], eps)

    ln_1, ln_2 = ("ln_2", "ln_1") if wiring == "swapped_norms" else ("ln_1", "ln_2")
    if wiring == "post_ln":
        a, k, v = attention(x, w, n_head, prefix + "attn.", past)
        x = ln(ln_1, x + a)
        return ln(ln_2, x + mlp(x, w, prefix + "mlp.")), k, v
    if wiring == "mlp_first":
        x = x + mlp(ln(ln_2, x), w, prefix + "mlp.")
        a, k, v = attention(ln(ln_1, x), w, n_head, prefix + "attn.", past)
        return x + a, k, v
    a, k, v = attention(ln(ln_1, x), w, n_head, prefix + "attn.", past)
    x = a if wiring == "no_attn_residual" else x + a
    m = mlp(ln(ln_2, x), w, prefix + "mlp.")
    return (m if wiring == "no_mlp_residual" else x + m), k, v


def gpt2(ids: np.ndarray, w: dict[str, np.ndarray], n_head: int, prefix: str = "",
         past: list | None = None, eps: float = 1e-5, *, final_norm: bool = True, final_eps: float | None = None,
         positions: bool = True, offset_positions: bool = True) -> tuple[np.ndarray, list]:
    """GPT2Model: ids [b, t] -> (hidden [b, t, e], [(keys, values)] per block)."""
    past_len = past[0][0].shape[2] if past else 0
    t = ids.shape[1]
    x = w[prefix + "wte.weight"][ids].astype(np.float32)
    if positions:
        start = past_len if offset_positions else 0
        x = x + w[prefix + "wpe.weight"][start:start + t]
    n_layer = len({name[len(prefix):].split(".")[1] for name in w if name.startswith(prefix + "h.")})
    present = []
    for i in range(n_layer):
        x, k, v = block(x, w, n_head, f"{prefix}h.{i}.", past[i] if past else None, eps)
        present.append((k, v))
    if final_norm:
        x = layer_norm(x, w[prefix + "ln_f.weight"], w[prefix + "ln_f.bias"], eps if final_eps is None else final_eps)
    return x, present


def lm_logits(ids: np.ndarray, w: dict[str, np.ndarray], n_head: int, eps: float = 1e-5,
              past: list | None = None) -> tuple[np.ndarray, list]:
    """GPT2LMHeadModel: (logits [b, t, vocab], cache). The head is lm_head.weight
    (for a loaded checkpoint, the wte table: tied), or wte where it is absent."""
    hidden, present = gpt2(ids, w, n_head, "transformer.", past, eps)
    return linear(hidden, w.get("lm_head.weight", w["transformer.wte.weight"]), None), present


def greedy(ids: list[int], w: dict[str, np.ndarray], n_head: int, max_new_tokens: int,
           eps: float = 1e-5) -> list[int]:
    """Greedy continuation, recomputing the whole sequence each step (no cache)."""
    ids = list(ids)
    new = []
    for _ in range(max_new_tokens):
        logits, _ = lm_logits(np.array([ids]), w, n_head, eps)
        token = int(np.argmax(logits[0, -1]))
        ids.append(token)
        new.append(token)
    return new
