"""The checkpoint, through the app's own loader.

weights/ already turns a Hugging Face GPT-2 folder into the course model's
parameters: it reads model.safetensors (or shards; float32, float16 and
bfloat16 files alike), skips the causal-mask buffers older checkpoints carry,
transposes the four Conv1D matrices (stored [in, out], nn.Linear wants
[out, in]), checks every shape against config.json and ties ``lm_head`` to
``wte``. The served network has the same parameter names, so serving loads
exactly what ``generate`` loads.
"""

from __future__ import annotations

from pathlib import Path

from max.dtype import DType
from max.graph.weights import WeightData

from model import caches
from model.gpt2 import with_vocab_rows
from weights import load_state


def gpt2_state(folder: Path, config, dtype: DType, head_width: int) -> dict[str, WeightData]:
    """{parameter name: WeightData} in ``dtype`` (float32, or bfloat16 on a GPU), the
    embedding and head ``head_width`` rows (zero past the vocabulary: the
    app's own widening, model/gpt2.py)."""
    state = {}
    arrays = with_vocab_rows(load_state(folder, config, caches.float32_copies(folder)), head_width)
    for name, array in arrays.items():
        # A float32 file's tensors arrive as writable copy-on-write views of
        # the file (weights/checkpoint.py): the engine's DLPack import uses
        # them in place (in 26.7 it cannot export a read-only array).
        data = WeightData.from_numpy(array, name)
        state[name] = data if dtype == DType.float32 else data.astype(dtype)
    return state
