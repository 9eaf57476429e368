"""``python -m maintain.server_targets`` (``pixi run targets-serve``): compile the
server's graph, without running it, for hardware that is not here, as
``python -m maintain.targets`` does for the app's (its ``--help`` and
docs/platforms.md say how).

The server's graph is the one the serving engine compiles: the course's
model with the engine's paged KV cache (serve/network.py), over a ragged
batch, as ``GPT2EngineModule``, with the engine's own input types for a
ModuleV3 model with a paged cache. The engine itself is not started: it
would allocate the cache on the device, which a virtual device cannot. The
parameters are declared on the target's device when the module is built
(the engine builds them on the host and moves them, an eager transfer that
a virtual device refuses), which gives the same graph. float32 on a CPU;
on a GPU the app's precisions there (maintain/targets.py's GPU_DTYPES): the
architecture declares float32 and bfloat16, and ``python -m serve`` serves
float32 (model/device.py's bfloat16_fault says why).
"""

from __future__ import annotations

import sys
from pathlib import Path

from artifacts.targets import Target
from maintain.targets import GPU_DTYPES, Check, build_options, main
from model.device import AUTO_DTYPE


def served_module(folder: Path, options, gpu: bool):
    """The server's module for ``folder`` as ``options`` build it (float32 or
    bfloat16; the course's ``options.impl``), its parameters declared on the
    target's device, with the engine's input types and its config."""
    from max.driver import CPU, Accelerator
    from max.experimental import functional as F
    from max.experimental.tensor import default_device, default_dtype
    from max.graph import DeviceRef
    from max.pipelines.lib import KVCacheConfig
    from max.pipelines.lib.interfaces.batch_processor import modulev3_ragged_kv_symbolic_inputs

    from serve.model import GPT2EngineModule
    from serve.model_config import GPT2ServeConfig

    if options.dtype not in GPT2ServeConfig.SUPPORTED_ENCODINGS:
        raise ValueError(f"the server runs {' and '.join(sorted(GPT2ServeConfig.SUPPORTED_ENCODINGS))}, "
                         f"not {options.dtype}")
    devices = [DeviceRef.GPU() if gpu else DeviceRef.CPU()]
    config = GPT2ServeConfig.build(folder, options, options.dtype, devices, KVCacheConfig())
    with F.lazy(), default_dtype(config.dtype), default_device(Accelerator() if gpu else CPU()):
        module = GPT2EngineModule(config)
    return module, modulev3_ragged_kv_symbolic_inputs(kv_params=config.kv_params, device_refs=devices), config


def build_served_graph(folder: Path, target: Target, dtype: str) -> str:
    """The server's graph for ``target`` at ``dtype``, compiled and never run."""
    from serve.weight_adapters import gpt2_state

    options = build_options(target, dtype)
    module, inputs, config = served_module(folder, options, target.gpu)
    module.compile(*inputs, weights=gpt2_state(folder, config.gpt2, config.dtype, config.head_width))
    return ""


def trace_served_graph(folder: Path, target: Target, dtype: str):
    """The server's graph for ``target`` at ``dtype``, traced, not compiled: what ``build_served_graph`` compiles."""
    options = build_options(target, dtype)
    module, inputs, _ = served_module(folder, options, target.gpu)
    return module.trace(*inputs).graph


def served_digest(folder: Path, options) -> str:
    """A digest of the server's graph for ``folder`` on this CPU as ``options``
    build it, traced, not compiled (seconds): what tells two builds apart."""
    from model.graph_source import graph_digest

    module, inputs, _ = served_module(folder, options, gpu=False)
    return graph_digest(module.trace(*inputs).graph)


def ci_plan(every_host: bool = False) -> dict[str, tuple[str, ...]]:
    """What every CI run compiles of the server: the GPU most users rent, in
    the server's precision there (float32). (The server's CPU graph is compiled
    and run by the serving tests on every machine.)"""
    return {"sm_90a": (AUTO_DTYPE["gpu"],)}


SERVED = Check("maintain.server_targets", "the server's graph (the course's model with the engine's paged KV cache)",
               GPU_DTYPES, ("float32",), build_served_graph, trace_served_graph, ci_plan)

if __name__ == "__main__":
    sys.exit(main(check=SERVED))
