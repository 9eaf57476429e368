"""Real GPT-2 weights, when this machine has them: our greedy continuation of a
fixed prompt must equal Hugging Face's, and the attention map must draw.

Runs when GPT2_MAX_PRETRAINED names a checkpoint folder (config.json,
model.safetensors, vocab.json, merges.txt), or when `gpt2` is in the Hugging
Face cache (e.g. after `python -m model --model gpt2 hi` with network).
Otherwise it is skipped, with the reason in pytest's summary (-ra).
The reference is transformers + torch when torch is importable, else the
numpy oracle (checker/oracle.py) on the same weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

PROMPT = "Hello, I'm a language model,"
NEW_TOKENS = 12


def _pretrained_folder() -> Path | None:
    named = os.environ.get("GPT2_MAX_PRETRAINED")
    if named:
        return Path(named)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download("gpt2", local_files_only=True,
                                      allow_patterns=["config.json", "model.safetensors", "vocab.json", "merges.txt"]))
    except Exception:
        return None


FOLDER = _pretrained_folder()
pytestmark = pytest.mark.skipif(
    FOLDER is None or not (FOLDER / "model.safetensors").is_file(),
    reason="no pretrained GPT-2 here: set GPT2_MAX_PRETRAINED=/path/to/gpt2 or download `gpt2` into the HF cache",
)


def _reference(folder: Path, ids: list[int]) -> tuple[list[int], str]:
    try:
        import torch
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(folder).eval()
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=50256)
        return out[0, len(ids):].tolist(), "transformers"
    except ImportError:
        from checker import oracle
        from weights import load_state, read_config

        weights = load_state(folder, read_config(folder))
        return oracle.greedy(ids, weights, read_config(folder).n_head, NEW_TOKENS), "numpy oracle"


def test_greedy_continuation_matches_reference():
    from model.generate import generate
    from model.gpt2 import load_gpt2
    from model.sampling import Sampling

    gpt2 = load_gpt2(FOLDER, device="cpu")
    [result] = generate(gpt2, [PROMPT], NEW_TOKENS, Sampling(temperature=0.0, top_k=None))
    expected, source = _reference(FOLDER, gpt2.tokenizer.encode(PROMPT))
    assert result.tokens == expected, f"differs from {source}: {gpt2.tokenizer.decode(result.tokens)!r}"
    assert np.all(np.asarray(result.tokens) < 50257)


def test_attention_map_of_real_gpt2(tmp_path):
    import struct

    from model.attention_map import figure_pixels, load_attention_model, main, probabilities

    out = tmp_path / "gpt2-layer5.png"
    assert main(["--model", str(FOLDER), "--layer", "5", "--out", str(out), "The cat sat on the mat"]) == 0
    model = load_attention_model(FOLDER, 5)
    config = model.config
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == figure_pixels(config.n_head)
    probs = probabilities(model, model.tokenizer.encode("The cat sat on the mat"))
    assert probs.shape[0] == config.n_head and np.allclose(probs.sum(-1), 1, atol=1e-4)
