"""config.json -> the GPT2Config of step 01."""

from __future__ import annotations

import json
from pathlib import Path

from weights.errors import WeightsError

# Activations that are GPT-2's tanh-approximated GELU under another name.
TANH_GELU = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"}


def read_config(folder: Path, config_class=None):
    """Read ``folder/config.json`` into ``config_class`` (default: the
    solution's GPT2Config), refusing anything that is not GPT-2's architecture."""
    if config_class is None:
        from solutions.solution_01 import GPT2Config as config_class
    path = Path(folder) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise WeightsError(f"{path}: not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WeightsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise WeightsError(f"{path}: expected a JSON object")
    model_type = raw.get("model_type")
    if model_type != "gpt2":
        archs = ", ".join(raw.get("architectures") or []) or "unknown"
        raise WeightsError(
            f"{path}: model_type is {model_type!r} (architectures: {archs}); only GPT-2-architecture models are supported"
        )
    activation = raw.get("activation_function", "gelu_new")
    if activation not in TANH_GELU:
        raise WeightsError(f"{path}: activation_function {activation!r} is not GPT-2's gelu_new")
    n_inner = raw.get("n_inner")
    if n_inner not in (None, 4 * raw.get("n_embd", 768)):
        raise WeightsError(f"{path}: n_inner {n_inner} is not 4 * n_embd; only GPT-2's MLP width is supported")
    fields = dict(
        vocab_size=raw.get("vocab_size", 50257),
        n_positions=raw.get("n_positions", raw.get("n_ctx", 1024)),
        n_embd=raw.get("n_embd", 768),
        n_layer=raw.get("n_layer", 12),
        n_head=raw.get("n_head", 12),
        layer_norm_epsilon=raw.get("layer_norm_epsilon", 1e-5),
    )
    try:
        return config_class(**fields)
    except (ValueError, TypeError) as exc:
        raise WeightsError(f"{path}: {exc}") from None
