"""Pretrained GPT-2 weights: find them, read them, map them onto the model.

    checkpoint = open_checkpoint("gpt2")    # all of the below, read once (weights/folder.py)
    folder = resolve_model("gpt2")          # hub id (HF cache) or a local folder
    config = read_config(folder)            # config.json -> step 01's GPT2Config
    state = load_state(folder, config)      # safetensors -> {module name: array}
    tokenizer = load_tokenizer(folder, config)

Every problem is a ``WeightsError`` whose message is one line naming the file
or value and what to do about it.
"""

from weights.checkpoint import TRANSPOSED, expected_shapes, load_state
from weights.config import read_config, read_eos_token_ids
from weights.errors import WeightsError
from weights.folder import Checkpoint, open_checkpoint
from weights.resolve import resolve_model
from weights.tokenizer import load_tokenizer

__all__ = [
    "Checkpoint",
    "TRANSPOSED",
    "WeightsError",
    "expected_shapes",
    "load_state",
    "load_tokenizer",
    "open_checkpoint",
    "read_config",
    "read_eos_token_ids",
    "resolve_model",
]
