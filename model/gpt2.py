"""The GPT-2 the app runs: the curriculum's own blocks, loaded and compiled.

    gpt2 = load_gpt2("gpt2")                       # or a local folder
    cache = gpt2.empty_cache(batch=1)
    logits, cache = gpt2.step(ids, cache)          # prefill: the whole prompt
    logits, cache = gpt2.step(next_ids, cache)     # decode: one token each

The model is ``GPT2LMHeadModel`` from the solutions (``impl="solutions"``) or
from the learner's own ``steps/`` (``impl="steps"``): the code written in the
course is the code that runs. It is built under ``F.lazy()`` (no random init),
loaded with the checkpoint, and compiled once into one MAX graph whose batch,
sequence and cache lengths are symbolic: the same graph prefills a prompt of
any length (with an empty cache) and decodes one token at a time, for the
whole process. MAX keeps the compiled graph in its disk cache between runs.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from model.device import Placement, choose
from weights import load_state, load_tokenizer, read_config, resolve_model

IMPLS = ("solutions", "steps")


def model_classes(impl: str = "solutions"):
    """(GPT2Config, GPT2LMHeadModel) from the solutions or the learner's steps."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, not {impl!r}")
    prefix = "solutions.solution_" if impl == "solutions" else "steps.step_"
    config_module = importlib.import_module(prefix + "01")
    model_module = importlib.import_module(prefix + "11")
    return config_module.GPT2Config, model_module.GPT2LMHeadModel


def _graph_module(lm, last_only: bool):
    """Wrap the model for compiling: flat tensors in, flat tensors out."""
    from max.dtype import DType
    from max.experimental import nn

    class GPT2Graph(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, ids, *past_flat):
            past = list(zip(past_flat[0::2], past_flat[1::2]))
            logits, present = self.lm(ids, past, last_only=last_only)
            return (logits.cast(DType.float32), *(t for kv in present for t in kv))

    return GPT2Graph()


@dataclass
class GPT2:
    """A loaded, compiled GPT-2 and what is needed to drive it."""

    config: object
    placement: Placement
    compiled: object = field(repr=False)
    compile_seconds: float
    last_only: bool
    tokenizer: object = field(default=None, repr=False)
    source: str = ""
    quantized_layers: int = 0  # Linear layers (and LM head) in q4_0 / q6_k

    @property
    def head_dim(self) -> int:
        return self.config.n_embd // self.config.n_head

    def empty_cache(self, batch: int) -> list:
        """A cache holding nothing: n_layer (key, value) pairs of length 0."""
        from max.experimental.tensor import Tensor

        shape = [batch, self.config.n_head, 0, self.head_dim]
        empty = Tensor.zeros(shape, dtype=self.placement.max_dtype(), device=self.placement.max_device())
        return [empty] * (2 * self.config.n_layer)

    def step(self, ids: np.ndarray, cache: list) -> tuple[np.ndarray, list]:
        """Run ``ids`` [batch, seq] after the cached positions.

        Returns the logits (float32 numpy; [batch, vocab] of the last position
        when compiled with ``last_only``, else [batch, seq, vocab]) and the new
        cache (device tensors, to pass to the next call)."""
        from max.dtype import DType

        out = self.compiled(self._tensor(np.asarray(ids, dtype=np.int64), DType.int64), *cache)
        logits = out[0].to(self._cpu()).to_numpy()
        return (logits[:, -1] if self.last_only else logits), list(out[1:])

    def forward_logits(self, ids: np.ndarray) -> np.ndarray:
        """Logits without a cache ([batch, vocab] or [batch, seq, vocab])."""
        return self.step(ids, self.empty_cache(len(ids)))[0]

    def _tensor(self, array: np.ndarray, dtype):
        from max.experimental.tensor import Tensor

        t = Tensor.from_dlpack(np.ascontiguousarray(array))
        if t.dtype != dtype:
            t = t.cast(dtype)
        return t.to(self.placement.max_device()) if self.placement.kind != "cpu" else t

    @staticmethod
    def _cpu():
        from max.driver import CPU

        return CPU()


def build_lm(config, impl: str = "solutions", dtype=None):
    """GPT2LMHeadModel built lazily (no random init), its parameters in
    ``dtype`` (default float32). The dtype is always set explicitly: MAX's own
    default depends on the device (bfloat16 where an accelerator is present)."""
    from max.dtype import DType
    from max.experimental import functional as F
    from max.experimental.tensor import default_dtype

    _, model_class = model_classes(impl)
    with F.lazy(), default_dtype(dtype or DType.float32):
        return model_class(config)


def compile_lm(lm, config, placement: Placement, last_only: bool = True):
    """Compile ``lm`` for ``placement``; returns (compiled, seconds)."""
    from max.dtype import DType
    from max.graph import TensorType

    device = placement.max_device()
    graph = _graph_module(lm, last_only)
    head_dim = config.n_embd // config.n_head
    ids_type = TensorType(DType.int64, ["batch", "seq"], device=device)
    kv_type = TensorType(placement.max_dtype(), ["batch", config.n_head, "past", head_dim], device=device)
    start = time.perf_counter()
    compiled = graph.compile(ids_type, *([kv_type] * (2 * config.n_layer)))
    return compiled, time.perf_counter() - start


def load_gpt2(model: str | Path, device: str = "auto", dtype: str = "auto", impl: str = "solutions",
              last_only: bool = True, with_tokenizer: bool = True) -> GPT2:
    """Resolve, read, verify, build, load and compile a GPT-2 checkpoint.

    Raises ``weights.WeightsError`` or ``model.device.DeviceError`` with a
    one-line message for anything the user can fix."""
    placement = choose(device, dtype)
    folder = resolve_model(str(model))
    config_class, _ = model_classes(impl)
    config = read_config(folder, config_class)
    tokenizer = load_tokenizer(folder, config) if with_tokenizer else None
    state = load_state(folder, config)  # every shape verified before loading
    lm = build_lm(config, impl, placement.max_dtype())
    lm.load_state_dict(state, auto_cast=placement.dtype == "bfloat16")
    quantized = 0
    if placement.quantized:
        from model.quantize import quantize_lm

        quantized = quantize_lm(lm, state, placement.dtype)
    if placement.kind != "cpu":
        lm.to(placement.max_device())
    compiled, seconds = compile_lm(lm, config, placement, last_only)
    return GPT2(config, placement, compiled, seconds, last_only, tokenizer, str(folder), quantized)
