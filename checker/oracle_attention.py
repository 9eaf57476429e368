"""The bonus steps' attention formulations in plain numpy (steps 13-16), with
knobs for the mistakes their checks recognise. Builds on checker/oracle.py."""

from __future__ import annotations

import numpy as np

from checker.oracle import attend, causal_mask, layer_norm, linear, merge_heads, softmax, split_heads


def multi_head_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, n_heads: int, *,
                         split_transpose: bool = True, merge_transpose: bool = True, **attend_knobs) -> np.ndarray:
    """(T_q, D), (T_k, D), (T_k, D) -> (T_q, D), no mask (step 13)."""
    q, k, v = (split_heads(m[None], n_heads, transpose=split_transpose) for m in (Q, K, V))
    return merge_heads(attend(q, k, v, None, **attend_knobs), transpose=merge_transpose)[0]


def post_ln_block(x: np.ndarray, w_q, w_k, w_v, w_o, n_heads: int, eps: float = 1e-5, *,
                  wiring: str = "post_ln", transpose_weights: bool = False, ddof: int = 0,
                  **attend_knobs) -> np.ndarray:
    """LayerNorm(x + MultiHead(x) W_o) with x @ W projections (step 14).

    ``wiring``: "post_ln" (right), "pre_ln" (x + MHA(LN(x)) W_o),
    "no_residual" (LN(MHA(x) W_o))."""
    def proj(h, w):
        return h.astype(np.float64) @ (w.T if transpose_weights else w).astype(np.float64)

    def norm(h):
        d = h.shape[-1]
        return layer_norm(h, np.ones(d), np.zeros(d), eps, ddof=ddof)

    def mha(h):
        q, k, v = (split_heads(proj(h, w), n_heads) for w in (w_q, w_k, w_v))
        return proj(merge_heads(attend(q, k, v, None, **attend_knobs)), w_o)

    if wiring == "pre_ln":
        return (x + mha(norm(x))).astype(np.float32)
    if wiring == "no_residual":
        return norm(mha(x))
    return norm(x + mha(x))


def attention_probs(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """softmax(q k^T / sqrt(d) + mask) over the keys (step 15)."""
    scores = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) / np.sqrt(q.shape[-1])
    return softmax(scores if mask is None else scores + mask, axis=-1).astype(np.float32)


def rope(x: np.ndarray, positions: np.ndarray, theta: float = 10000.0, *, interleaved: bool = False,
         freq_width: int | None = None) -> np.ndarray:
    """Rotate x [..., seq, d] by its positions: "rotate half" pairs i and i + d/2,
    ``interleaved`` pairs 2i and 2i + 1 (Meta's layout, a known mismatch);
    ``freq_width``: the width in the frequency exponent (d unless mistaken)."""
    d = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, d, 2) / (freq_width or d))
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [seq, d/2]
    cos, sin = np.cos(angles), np.sin(angles)
    x = x.astype(np.float64)
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out
    first, second = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def rotary_attention(x: np.ndarray, w: dict[str, np.ndarray], n_heads: int, positions: np.ndarray,
                     theta: float = 10000.0, *, rotate: str = "qk", causal: bool = True,
                     interleaved: bool = False, freq_width: int | None = None) -> np.ndarray:
    """Causal self-attention with RoPE (step 16); ``rotate`` says which of
    q, k, v are rotated (right: "qk")."""
    q, k, v = (split_heads(linear(x, w[f"{n}_proj.weight"], None), n_heads) for n in "qkv")
    parts = {"q": q, "k": k, "v": v}
    for name in rotate:
        parts[name] = rope(parts[name], positions, theta, interleaved=interleaved, freq_width=freq_width)
    t = x.shape[1]
    out = attend(parts["q"], parts["k"], parts["v"], causal_mask(t) if causal else None)
    return linear(merge_heads(out), w["out_proj.weight"], None)
