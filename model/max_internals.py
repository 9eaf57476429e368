"""Every name of MAX's that it does not publish and this project relies on, in one place.

MAX is pinned (pyproject.toml: ``max==26.7.0``), and each name below is one that
version has; none is MAX's documented API, so an upgrade may move or drop any of
them without notice. The rest of the project imports them from here, and
tests/test_max_internals.py resolves every one and fails naming it. What each
is for, and what breaks without it, is said beside it.

Not Python, so named here and checked by that test: the Mojo kernels import
``extensibility._FusedOutputTensor`` (model/kernels/matmul.mojo, q4_0.mojo: an
output the graph compiler may fuse with the op that follows).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

# --- The eager interpreter's compile events (the checker's compile notices) -------------------
# max._eager_policy: the interpreter asks ``allow_lazy_compile()`` right before it compiles an
# op it has not cached, and reports each finished compile to ``record_cold_compile(key,
# seconds, provisioned=...)`` (which logs only the first). The checker replaces both to learn
# when a run is really compiling.
EAGER_POLICY = "max._eager_policy"


def eager_policy():
    """The module (None where a MAX without it is installed: the notices then fall back)."""
    try:
        from max import _eager_policy as module
    except ImportError:
        return None
    if not all(hasattr(module, name) for name in ("allow_lazy_compile", "record_cold_compile")):
        return None
    return module


# --- The eager executor that compiles nothing in the background ------------------------------
# max.experimental.executor: MAX's default eager executor ("composite") interprets a graph it
# has not seen and at the same time compiles it in a pool of background processes
# (max.experimental.compile_pool), for the calls that follow. Where each eager graph runs once
# or twice, as in a test suite, those compiles only take cores from the work. The executor
# MAX's own CI sets (``MAX_EAGER_EXECUTOR=fallback-internal``, not a supported mode)
# interprets, and compiles in the calling process only the graphs the interpreter refuses
# (a custom op, for one). Its class is private; it is made from MAX's table of executors.
NO_BACKGROUND_COMPILES = "fallback-internal"


def executor_without_background_compiles():
    """MAX's eager executor that compiles only what its interpreter refuses, in this process."""
    from max.experimental import executor

    return executor._EXECUTORS[NO_BACKGROUND_COMPILES]()


# max._interpreter_ops.gc_compile: the eager interpreter's ops come in families (binary, cast,
# reduce_axis, ...); each family compiles a "sweep", one kernel per op, device and dtype it
# supports, as one module (``build_sweep_module``). ``MAX_EAGER_WARM_STORE`` names a folder
# that holds each family's sweep compiled into a MEF (``warm_artifact_name``: ``binary_cpu.mef``)
# listed in a MefStore manifest: the first time a process meets a family, MAX loads its sweep
# from there instead of compiling it (``GCOpFamily._adopt_from_store``), for every family,
# whatever the CPU's model (MAX's disk cache keys include the host CPU's model, even under a
# named target). checker/eager_kernels ships such a store.
EAGER_FAMILIES = "max._interpreter_ops.gc_compile"
WARM_STORE = "MAX_EAGER_WARM_STORE"  # gc_compile.WARM_STORE_ENV_VAR


def eager_families() -> list:
    """Every eager op family of this MAX (importing them registers them)."""
    import max._interpreter_ops  # noqa: F401
    from max._interpreter_ops import gc_compile

    return list(gc_compile.registered_families())


def eager_sweep(family) -> tuple[object, str]:
    """``family``'s sweep as one module of graphs, and the name MAX's warm
    store gives its CPU artifact (what ``_adopt_from_store`` asks for)."""
    from max._interpreter_ops import gc_compile
    from max.driver import CPU

    return family.build_sweep_module(), gc_compile.warm_artifact_name(family.name, CPU())


# --- The server --------------------------------------------------------------------------------
def serve_entrypoints() -> tuple[Any, Any]:
    """(``max._entrypoints.pipelines``, its ``cli.serve.serve_api_and_model_worker`` module):
    ``max serve`` run in-process, and the module whose ``fastapi_app`` the project wraps
    with its request checks (serve/engine.py)."""
    from max._entrypoints import pipelines
    from max._entrypoints.cli.serve import serve_api_and_model_worker

    return pipelines, serve_api_and_model_worker


def openai_error_body(*args, **kwargs):
    """MAX's server's error JSON (``max.serve._error_envelope``), so the project's own
    refusals read exactly like MAX's."""
    from max.serve._error_envelope import openai_error_body as body

    return body(*args, **kwargs)


def select_quantization_encoding(model_config, default):
    """The weight encoding MAX's pipeline config resolves for a model
    (``max.pipelines.lib.config.model_config._select_quantization_encoding``)."""
    from max.pipelines.lib.config.model_config import _select_quantization_encoding

    return _select_quantization_encoding(model_config, default)


def telemetry_disabled(settings) -> bool:
    """Whether MAX's server sends no telemetry under ``settings``
    (``max.serve.telemetry.common._telemetry_disabled``; the tests read it)."""
    from max.serve.telemetry.common import _telemetry_disabled

    return _telemetry_disabled(settings)


def mef_store_key(graph) -> str:
    """The name MAX's ``MefStore`` gives a graph's artifact by default: its name and a digest of its
    input and output types (``max.engine._precompiled_mefs._default_key``); a store reading
    artifacts with a key of its own must name them the same way."""
    from max.engine._precompiled_mefs import _default_key

    return _default_key(graph)


def mef_store_fingerprint(graph) -> str:
    """What MAX's ``MefStore`` records of a graph's body beside its artifact, to tell two graphs of
    one name apart (``max.engine._precompiled_mefs._fingerprint``)."""
    from max.engine._precompiled_mefs import _fingerprint

    return _fingerprint(graph)


# --- Tensors and graph values --------------------------------------------------------------------
def graph_value(tensor):
    """The graph value behind an experimental ``Tensor`` traced in a graph (``_graph_value``):
    the paged KV cache's inputs arrive as tensors and the engine's unflattening wants values."""
    return tensor._graph_value


def tensor_value(tensor):
    """A ``Tensor``'s graph value through ``__tensorvalue__`` (the app's in-place cache passes its
    start and end as values to ``buffer_store_slice``'s slices)."""
    return tensor.__tensorvalue__()


# A Mojo module that mojo's importer compiles into the installed package on first import, for
# the CPU at hand; tests/avx2_under_qemu.py stubs it under emulation (nothing it runs calls it).
KV_CACHE_OPS = "max._kv_cache_ops"
FUSED_OUTPUT_TENSOR = "_FusedOutputTensor"  # from Mojo's ``extensibility`` package


def build_kv_cache_ops() -> None:
    """Build KV_CACHE_OPS if this install has not yet, in a child process (seconds; under a second
    once built). mojo's importer writes the library under its final name as it compiles it, so a
    process that imports it meanwhile reads a half-written file ("... .so: file too short") or has
    it deleted under it. Called before starting processes that import MAX side by side on what may
    be a fresh install: the test workers (tests/conftest.py), the targets check's compiles. In a
    child, because loading it sets PYTHONEXECUTABLE in the process's C-level environment (to the
    ``python3`` on PATH), which the processes this one starts would inherit as their
    ``sys.executable``."""
    subprocess.run([sys.executable, "-c", f"import {KV_CACHE_OPS}"], env=dict(os.environ), check=True)


# --- MAX's error text, read for the checker's hints ----------------------------------------------
# A graph op MAX refuses to build raises a message starting "Failed to create op"; its inputs
# follow as "name = TensorValue(dtype=..., shape=[...], device=...)" and the reason comes after a
# line "Diagnostics:" (checker/harness.py turns it into a short error and a hint).
OP_FAILED = "Failed to create op"
DIAGNOSTICS = "Diagnostics:"
INFER_FAILED = "Failed to infer"  # a line of the diagnostics that restates the failure
OP_INPUT = re.compile(r"(\w+) = \w*Value\(dtype=(\w+), shape=\[(.*?)\], device=([^)]*)\)")
SHAPE = re.compile(r"shape=\[(.*?)\]")  # every shape in the message
DIM = re.compile(r"Dim\((.*?)\)")  # a symbolic dimension as MAX prints it
ADD_OP = "'AddOp'"  # the op named when an add's shapes disagree
DTYPE_MISMATCH = ("Failed to resolve valid dtype", "Unsafe cast")
MATMUL_OP = "MatmulOp"
