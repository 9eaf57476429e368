"""What the engine needs to know about a GPT-2 checkpoint to serve it.

The engine reads config.json with transformers' GPT2Config (whose
``attribute_map`` answers ``hidden_size``, ``num_attention_heads``,
``num_hidden_layers`` and ``max_position_embeddings``); the network itself is
built from step 01's GPT2Config (the solution's, or the learner's with
``python -m serve --impl steps``), read by weights/ with the same refusals as
``generate`` (a checkpoint this project cannot run as Hugging Face does is
never served as something else).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from max.dtype import DType
from max.graph import DeviceRef
from max.nn.kv_cache import KVCacheParams
from max.pipelines.kv_cache import cache_dtype_for_encoding
from max.pipelines.lib import KVCacheConfig, MAXModelConfig, PipelineConfig
from max.pipelines.lib.interfaces.arch_config import ArchConfigWithKVCache, ArchConfigWithStoredKVParams
from max.pipelines.modeling.config_enums import SupportedEncoding, supported_encoding_dtype
from transformers import AutoConfig
from typing_extensions import Self

from model.course import config_class
from model.gpt2 import graph_vocab
from model.max_internals import select_quantization_encoding
from model.options import BuildOptions
from weights import read_config, resolve_model

OPTIONS = "GPT2_SERVE_OPTIONS"  # python -m serve sets it for the engine's process: BuildOptions as JSON


def served_options() -> BuildOptions:
    """The build options ``python -m serve`` chose (``--impl``, ``--linear``,
    the device and dtype), as the engine's process reads them: the engine
    builds the model there, so they travel in the environment."""
    try:
        return BuildOptions(**json.loads(os.environ.get(OPTIONS, "{}")))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{OPTIONS}={os.environ.get(OPTIONS)!r}: {exc}") from None


@dataclass(kw_only=True)
class GPT2ServeConfig(ArchConfigWithStoredKVParams, ArchConfigWithKVCache):
    """The engine's view of one GPT-2 checkpoint."""

    # float32 is what `python -m serve` runs, on the CPU and on a GPU (and what
    # the app's tests compare against Hugging Face in); bfloat16 is declared (and compiled for a GPU by
    # maintain/server_targets.py under a MAX that computes it right), but is not served: model/device.py's
    # bfloat16_fault says why.
    DEFAULT_ENCODING: ClassVar[SupportedEncoding] = "float32"
    SUPPORTED_ENCODINGS: ClassVar[set[SupportedEncoding]] = {"float32", "bfloat16"}

    gpt2: object  # step 01's GPT2Config, from weights.read_config
    options: BuildOptions  # which code builds the network, which Linear layers (served_options)
    folder: Path
    dtype: DType
    max_seq_len: int
    kv_params: KVCacheParams
    devices: list[DeviceRef]

    @property
    def head_width(self) -> int:
        """The LM head's rows in the graph: the vocabulary, wider on a GPU
        (model/gpt2.py's graph_vocab, as the app builds it)."""
        return graph_vocab(self.gpt2.vocab_size, self.options.placement)

    @classmethod
    def construct_kv_params(cls, huggingface_config: AutoConfig, pipeline_config: PipelineConfig,
                            devices: list[DeviceRef], kv_cache_config: KVCacheConfig, cache_dtype: DType,
                            **_) -> KVCacheParams:
        """The engine's hook (its memory planner calls it before any model exists)."""
        gpt2 = read_config(resolve_model(str(pipeline_config.model.model_path)))
        return cls._kv_params(gpt2, devices, kv_cache_config, cache_dtype, pipeline_config.model.data_parallel_degree)

    @staticmethod
    def _kv_params(gpt2, devices: list[DeviceRef], kv_cache_config: KVCacheConfig, cache_dtype: DType,
                   data_parallel_degree: int = 1) -> KVCacheParams:
        # GPT-2 has one key/value head per query head (no grouped-query
        # attention), so transformers' GPT2Config has no num_key_value_heads;
        # the sizes come from step 01's config, as everywhere in the project.
        return kv_cache_config.to_params(
            dtype=cache_dtype,
            n_kv_heads=gpt2.n_head,
            head_dim=gpt2.head_dim,
            num_layers=gpt2.n_layer,
            devices=devices,
            data_parallel_degree=data_parallel_degree,
        )

    @classmethod
    def initialize(cls, pipeline_config: PipelineConfig, model_config: MAXModelConfig | None = None, *,
                   max_seq_len: int) -> Self:
        model_config = model_config or pipeline_config.model
        encoding = select_quantization_encoding(model_config, cls.DEFAULT_ENCODING)
        devices = [DeviceRef(spec.device_type, spec.id) for spec in model_config.device_specs]
        # The engine's device and encoding are what runs, whatever the launcher said.
        options = replace(served_options(), device="cpu" if devices[0].is_cpu() else "gpu", dtype=str(encoding))
        return cls.build(resolve_model(str(model_config.model_path)), options, encoding, devices,
                         model_config.kv_cache, max_seq_len, pipeline_config.model.data_parallel_degree)

    @classmethod
    def build(cls, folder: Path, options: BuildOptions, encoding: SupportedEncoding, devices: list[DeviceRef],
              kv_cache_config: KVCacheConfig, max_seq_len: int | None = None, data_parallel_degree: int = 1) -> Self:
        """The config for the checkpoint in ``folder`` at ``encoding`` on
        ``devices``, its paged cache sized by ``kv_cache_config``: what the
        engine builds (``initialize``), and what maintain/server_targets.py compiles
        without an engine. ``max_seq_len``: the checkpoint's window by default."""
        gpt2 = read_config(folder, config_class(options.impl))
        cache_dtype = cache_dtype_for_encoding(encoding, kv_cache_config.kv_cache_format)
        return cls(
            gpt2=gpt2,
            options=options,
            folder=folder,
            dtype=supported_encoding_dtype(encoding),
            max_seq_len=max_seq_len or gpt2.n_positions,
            kv_params=cls._kv_params(gpt2, devices, kv_cache_config, cache_dtype, data_parallel_degree),
            devices=devices,
        )

    @classmethod
    def calculate_max_seq_len(cls, huggingface_config: AutoConfig, model_config: MAXModelConfig) -> int:
        """``--max-length`` if given (at most n_positions: wpe has no more
        rows), else the checkpoint's whole window."""
        window = huggingface_config.n_positions
        wanted = model_config.max_length
        if wanted is not None and wanted > window:
            raise ValueError(f"--max-length {wanted} exceeds this GPT-2's n_positions ({window}): "
                             "its position table has no rows past that")
        return wanted or window
