"""config.json -> the GPT2Config of step 01."""

from __future__ import annotations

import json
import math
from pathlib import Path

from weights.errors import WeightsError

# Fields Hugging Face's GPT-2 honours at inference that change the computation,
# with the only value this project runs; any other value is refused by name
# (README: "Which config.json fields are honoured").
GPT2_ONLY = {
    "scale_attn_weights": True,  # False: no 1 / sqrt(head_dim)
    "scale_attn_by_inverse_layer_idx": False,  # True: scores also / (layer_idx + 1)
    "reorder_and_upcast_attn": False,  # True: fp32 attention with the scale folded into q
    "add_cross_attention": False,  # True: an encoder-decoder block
    "tie_word_embeddings": True,  # False: a head of its own
}

# GPT-2 124M's sizes: a config.json without a field means these (as Hugging Face reads it).
DEFAULTS = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, layer_norm_epsilon=1e-5)

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
            f"{path}: model_type is {model_type!r} (architectures: {archs}); "
            "only GPT-2-architecture models are supported"
        )
    activation = raw.get("activation_function", "gelu_new")
    if activation not in TANH_GELU:
        raise WeightsError(f"{path}: activation_function {activation!r} is not GPT-2's gelu_new")
    for name, default in GPT2_ONLY.items():
        if raw.get(name, default) != default:
            raise WeightsError(f"{path}: {name} is {json.dumps(raw[name])}; this project runs GPT-2's default "
                               f"({json.dumps(default)}) only, so this checkpoint would give other text than "
                               "Hugging Face's")
    # Each field by the key it is read from (GPT-2's defaults where there is none).
    keys = dict(vocab_size="vocab_size", n_positions="n_positions" if "n_positions" in raw else "n_ctx",
                n_embd="n_embd", n_layer="n_layer", n_head="n_head", layer_norm_epsilon="layer_norm_epsilon")
    fields = {name: raw.get(key, DEFAULTS[name]) for name, key in keys.items()}
    for name, value in fields.items():
        if not _is_number(value, whole=name != "layer_norm_epsilon") or not value > 0:
            kind = "a number > 0" if name == "layer_norm_epsilon" else "a whole number > 0"
            raise WeightsError(f"{path}: {keys[name]} is {json.dumps(value)}; expected {kind}")
    n_inner = raw.get("n_inner")
    if n_inner not in (None, 4 * fields["n_embd"]):
        raise WeightsError(f"{path}: n_inner {n_inner} is not 4 * n_embd; only GPT-2's MLP width is supported")
    try:
        return config_class(**fields)
    except (ValueError, TypeError) as exc:
        raise WeightsError(f"{path}: {exc}") from None


def _is_number(value, whole: bool) -> bool:
    """A JSON number (a whole one when ``whole``) that is finite; not a bool."""
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return False
    return whole or math.isfinite(value)


def read_eos_token_ids(folder: Path) -> list[int] | None:
    """The ids that end generation, as Hugging Face's generate reads them:
    generation_config.json's ``eos_token_id`` (an int or a list), else
    config.json's; None when neither names one (then the tokenizer's)."""
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WeightsError(f"{path}: not valid JSON ({exc})") from None
        eos = raw.get("eos_token_id") if isinstance(raw, dict) else None
        if eos is None:
            continue
        ids = eos if isinstance(eos, list) else [eos]
        if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise WeightsError(f"{path}: eos_token_id {json.dumps(eos)} is not a token id or a list of them")
        return ids
    return None
