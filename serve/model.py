"""The pipeline model: how the engine builds, compiles and calls GPT-2.

Laid out like MAX's in-tree ModuleV3 models (llama3_modulev3): the engine's
``ModuleV3PipelineModelWithKVCache`` builds the module under ``F.lazy()``,
compiles it once for symbolic batch and length, and calls it every step with
a ragged batch and the paged cache; the ragged batching is Llama 3's, reused
as it is (tokens, row offsets, logits count, cache inputs).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from max import tree
from max.driver import CPU, Buffer
from max.experimental import nn
from max.experimental.tensor import Tensor
from max.nn.kv_cache import KVCacheInputsPerDevice
from max.pipelines.architectures.llama3_modulev3.batch_processor import Llama3ModuleV3BatchProcessor
from max.pipelines.context import LogProbabilities, TextContext
from max.pipelines.lib import ModuleV3Outputs, ModuleV3PipelineModelWithKVCache

from model.engine_threads import quiet_background_threads
from model.layers import linear_maker
from model.max_internals import graph_value
from serve import shipped
from serve.model_config import GPT2ServeConfig, served_options
from serve.network import GPT2Ragged
from serve.step_times import timed_step
from serve.weight_adapters import gpt2_state

logger = logging.getLogger("max.pipelines")

class GPT2EngineModule(GPT2Ragged):
    """GPT2Ragged (the course's model, serve/network.py) with the engine's
    calling convention: the cache arrives as a flat list of graph inputs,
    unflattened here (as Llama 3's top module does); same parameter names,
    so the same weights."""

    def __init__(self, config: GPT2ServeConfig) -> None:
        # Step 04's nn.Linear, or model/layers' for the options (float32 on the
        # CPU with --linear custom, the default: a decode step of a few
        # requests is a few rows, where MAX's own matmul streams the weights
        # slowest; docs/serving.md measures it). The kernels are CPU code.
        super().__init__(config.gpt2, config.kv_params, linear_maker(config.options) or nn.Linear,
                         impl=config.options.impl, head_width=config.head_width)
        self.engine_kv_params = config.kv_params

    def forward(self, tokens: Tensor, return_n_logits: Tensor, input_row_offsets: Tensor,
                *kv_inputs: Tensor) -> ModuleV3Outputs:
        values = self.engine_kv_params.unflatten_kv_inputs(iter(graph_value(x) for x in kv_inputs))
        kv = tree.leaves(values, leaf=KVCacheInputsPerDevice)[0]
        # The engine's return_n_logits input (a host vector) carries the rows to score: GPT2BatchProcessor.
        last, scored = super().forward(tokens, kv, input_row_offsets, return_n_logits)
        # No logit_offsets: the engine samples from next_token_logits as
        # always; the scored rows are for compute_log_probabilities (echo).
        return ModuleV3Outputs(next_token_logits=last, logits=scored)


class GPT2BatchProcessor(Llama3ModuleV3BatchProcessor):
    """Llama 3's ragged batching (tokens, row offsets, cache inputs), with
    the rows the graph scores in the engine's ``return_n_logits`` input (a
    host vector of any length, which the engine passes to the graph as it
    is and this model gives its own meaning): each sequence's last token,
    or with ``python -m serve --echo`` every token of the step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.every_position = served_options().every_position

    def prepare_initial_token_inputs(self, replica_batches, kv_cache_inputs=None, return_n_logits: int = 1):
        inputs = super().prepare_initial_token_inputs(replica_batches, kv_cache_inputs, return_n_logits)
        ends = np.cumsum([c.tokens.active_length for batch in replica_batches for c in batch], dtype=np.int64)
        rows = np.arange(ends[-1] if len(ends) else 0, dtype=np.int64) if self.every_position else ends - 1
        inputs.return_n_logits = Buffer.from_numpy(rows)
        return inputs


def echo_spans(rows: np.ndarray, offsets: np.ndarray, batch_echo: list[bool]) -> list[slice | None]:
    """Where each echo sequence's tokens' logits are among the rows the graph
    scored (``rows``: token indices, ascending): every one of its tokens must
    be there, as ``python -m serve --echo`` has it."""
    spans = []
    for i, echo in enumerate(batch_echo):
        if not echo:
            spans.append(None)
            continue
        start, end = (int(j) for j in np.searchsorted(rows, offsets[i: i + 2]))
        if end - start != int(offsets[i + 1]) - int(offsets[i]):
            raise ValueError("echo needs every position's logits: start the server with --echo")
        spans.append(slice(start, end))
    return spans


def log_probabilities(logits: np.ndarray, sampled: np.ndarray, batch_top_n: list[int],
                      echo_rows: list[np.ndarray | None] | None = None,
                      echo_tokens: list[np.ndarray | None] | None = None) -> list[LogProbabilities | None]:
    """Each row's sampled token's log-probability and its ``top_n``
    likeliest tokens' (the sampled one added if not among them), as MAX's
    ``LogProbabilitiesMixin`` returns them; None where ``top_n`` is 0.

    logits [batch, vocab] float32. With echo, ``echo_rows[i]`` holds sequence
    i's logits at each of this step's tokens [n, vocab] and ``echo_tokens[i]``
    those n tokens: the entries are then, as the mixin's, the log-probability
    of each token after the first given the ones before it, then the sampled
    token's under ``logits`` (n entries; the first token has none).

    The normalizer is summed in float64: MAX's log-probabilities kernel,
    given Hugging Face's own logits for the demo, is off by up to 1.5e-3 (its
    log-sum-exp over 50257 entries), where this stays within 1e-6 of HF's
    log_softmax."""
    out: list[LogProbabilities | None] = []
    for i, (row, token, top_n) in enumerate(zip(logits, sampled, batch_top_n, strict=True)):
        if top_n == 0:
            out.append(None)
            continue
        rows, targets = [row], [int(token)]
        if echo_rows is not None and echo_rows[i] is not None:
            # The prompt's own rows, then ``row``: the sampled token is scored
            # under the logits it was sampled from (penalties applied).
            rows, targets = [*echo_rows[i][:-1], row], [*map(int, echo_tokens[i][1:]), int(token)]
        scored = [scores(r, t, top_n) for r, t in zip(rows, targets, strict=True)]
        out.append(LogProbabilities(token_log_probabilities=[s[t] for s, t in zip(scored, targets)],
                                    top_log_probabilities=scored, sampled_token_ids=targets))
    return out


def scores(row: np.ndarray, token: int, top_n: int) -> dict[int, float]:
    """The ``top_n`` likeliest tokens' log-probabilities in ``row``'s
    distribution, most likely first, and ``token``'s last if not among them."""
    peak = float(row.max())
    log_z = peak + float(np.log(np.exp(row - peak, dtype=np.float64).sum()))
    ids = np.argpartition(-row, top_n)[:top_n] if top_n < row.shape[0] else np.arange(row.shape[0])
    ids = ids[np.argsort(-row[ids], kind="stable")]
    top = {int(t): float(row[t]) - log_z for t in ids}
    top[token] = float(row[token]) - log_z
    return top


def host_array(buffer: Buffer | np.ndarray) -> np.ndarray:
    if isinstance(buffer, np.ndarray):
        return buffer
    return (buffer if buffer.device.is_host else buffer.to(CPU())).to_numpy()


class GPT2PipelineModel(ModuleV3PipelineModelWithKVCache[TextContext]):
    """GPT-2 for ``max serve``: float32 on the CPU and on a GPU (``python -m
    serve`` serves no bfloat16: model/device.py's bfloat16_fault says why).

    ``compute_log_probabilities`` answers a request's ``logprobs`` (without
    it the engine returns ``null`` for them), from each sequence's last
    logits; ``echo`` (the prompt's log-probabilities) needs every position's,
    which the graph scores when the batch processor asks it to
    (``python -m serve --echo``: ``GPT2BatchProcessor``)."""

    model_config_cls: ClassVar[type[Any]] = GPT2ServeConfig
    batch_processor_cls: ClassVar[type[Llama3ModuleV3BatchProcessor]] = GPT2BatchProcessor

    def __init__(self, *args, **kwargs) -> None:
        # Before the engine compiles anything in this process (this model, then the sampler).
        logger.info(shipped.prepare())
        super().__init__(*args, **kwargs)

    def _load_state_dict(self) -> dict[str, Any]:
        # Read through weights/ (see weight_adapters.py), not the engine's
        # generic safetensors reader: one mapping for the app and the server.
        self._serve_config = GPT2ServeConfig.initialize(self.pipeline_config, max_seq_len=self.max_seq_len)
        c = self._serve_config
        return gpt2_state(c.folder, c.gpt2, c.dtype, c.head_width)

    def _create_model_config(self, state_dict: dict[str, Any]) -> GPT2ServeConfig:
        return self._serve_config

    def _instantiate_module(self, model_config: GPT2ServeConfig) -> GPT2EngineModule:
        module = GPT2EngineModule(model_config)
        # Which files the model is built from, in the server's log (with
        # --impl steps: the learner's folder, found through PYTHONPATH).
        source = Path(sys.modules[type(module.transformer).__module__].__file__).parent
        logger.info(f"GPT-2 from the course's {model_config.options.impl} in {source}")
        module.to(self.devices[0])
        return module

    def compute_log_probabilities(self, session, model_inputs, model_outputs, next_tokens: Buffer,
                                  batch_top_n: list[int], batch_echo: list[bool]) -> list[LogProbabilities | None]:
        """The engine's hook, called after sampling when a request in the
        batch asked for ``logprobs``. Computed here rather than by MAX's
        ``LogProbabilitiesMixin`` for its precision (``log_probabilities``).
        The sampler has applied penalties to these logits in place, as the
        mixin would see them too."""
        last = host_array(model_outputs.next_token_logits)
        sampled = host_array(next_tokens).reshape(-1)
        if not any(batch_echo):
            return log_probabilities(last, sampled, batch_top_n)
        # serve/checks.py refuses echo without --echo before it gets here; echo_spans checks again.
        scored = host_array(model_outputs.logits)
        tokens = host_array(model_inputs.tokens)
        offsets = host_array(model_inputs.input_row_offsets)
        spans = echo_spans(host_array(model_inputs.return_n_logits), offsets, batch_echo)
        return log_probabilities(last, sampled, batch_top_n, [None if s is None else scored[s] for s in spans],
                                 [None if s is None else tokens[offsets[i]: offsets[i + 1]]
                                  for i, s in enumerate(spans)])

    def execute(self, model_inputs):
        # Timed only with GPT2_MAX_STEP_TIMES set (serve/step_times.py; bench.serve --step-times).
        with timed_step(model_inputs.input_row_offsets.shape[0] - 1, model_inputs.tokens.shape[0],
                        self.devices[0].synchronize):
            outputs = super().execute(model_inputs)
        if self.devices[0].is_host:
            # As the app does after its first graph call (model/engine_threads.py):
            # MAX's background threads at the lowest priority; once per process.
            quiet_background_threads()
        return outputs
