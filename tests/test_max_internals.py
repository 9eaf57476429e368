"""model/max_internals.py holds every name of MAX's that is not its published API: each one
still resolves in the installed MAX, and no other file reaches for one itself. After an
upgrade, the failing test names what moved."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest
from conftest import pythonpath, run_python

from checker.skeleton import ROOT
from model import max_internals as mi

PRIVATE = re.compile(r"\bmax\._\w+|from max\.\S*\._\w+ import|import (_[a-z]\w*)|\._graph_value\b|__tensorvalue__"
                     r"|\b_eager_policy\b|_telemetry_disabled\b|_FusedOutputTensor\b")


def test_the_eager_interpreter_still_reports_its_compiles():
    policy = mi.eager_policy()
    assert policy is not None, f"{mi.EAGER_POLICY} lacks allow_lazy_compile / record_cold_compile"
    assert list(inspect.signature(policy.allow_lazy_compile).parameters) == []
    assert list(inspect.signature(policy.record_cold_compile).parameters) == ["key", "seconds", "provisioned"]
    source = inspect.getsource(importlib.import_module("max._interpreter_ops.gc_compile"))
    ask, report = source.find("allow_lazy_compile()"), source.find("record_cold_compile(")
    assert 0 <= ask < report, "MAX no longer asks before an on-the-fly compile and reports after it"


def test_max_still_takes_a_warm_store_of_the_eager_families_made_elsewhere():
    gc_compile = importlib.import_module(mi.EAGER_FAMILIES)
    families = mi.eager_families()  # imports every family
    assert families and all(callable(family.build_sweep_module) for family in families)
    assert mi.WARM_STORE == gc_compile.WARM_STORE_ENV_VAR
    from max.driver import CPU
    assert gc_compile.warm_artifact_name("binary", CPU()) == "binary_cpu.mef"
    adopt = inspect.getsource(gc_compile.GCOpFamily._adopt_from_store)
    assert "warm_store()" in adopt and "warm_artifact_name(" in adopt and "store.artifact(" in adopt
    lookup = inspect.getsource(gc_compile.GCOpFamily.model_for)
    assert lookup.find("self.ensure_swept()") < lookup.find("compile_single_target("), "a store is asked no more"
    engine = importlib.import_module("max.engine")
    assert all(hasattr(engine.MefStore, name) for name in ("for_export", "claim_export_artifact", "write_manifest"))
    assert hasattr(engine.CompiledModel, "export_mef")


def test_max_still_has_an_eager_executor_without_background_compiles():
    executor = importlib.import_module("max.experimental.executor")
    made = mi.executor_without_background_compiles()
    assert isinstance(made.interpreter, executor.InterpreterExecutor)
    assert "pool()" in inspect.getsource(executor.JitExecutor.compile)  # the default: a background pool
    assert "pool()" not in inspect.getsource(type(made)), "this one compiles in the background now"


def test_the_server_s_entry_and_error_body():
    pipelines, entry = mi.serve_entrypoints()
    assert callable(entry.fastapi_app) and "serve" in pipelines.main.commands
    body = mi.openai_error_body(400, "the prompt is too long")
    assert body["error"]["message"] == "the prompt is too long", body


def test_the_pipeline_s_encoding_and_telemetry_helpers():
    from max.pipelines.lib.config import model_config
    from max.serve.config import Settings

    assert callable(model_config._select_quantization_encoding)
    assert list(inspect.signature(mi.select_quantization_encoding).parameters) == ["model_config", "default"]
    assert isinstance(mi.telemetry_disabled(Settings()), bool)


def test_tensors_still_give_their_graph_values():
    from max.experimental.tensor import Tensor

    assert hasattr(Tensor, "_graph_value"), "Tensor._graph_value (serve/model.py's paged cache inputs)"
    assert hasattr(Tensor, "__tensorvalue__"), "Tensor.__tensorvalue__ (model/kv_cache.py's slices)"


def test_the_mojo_names():
    assert importlib.util.find_spec(mi.KV_CACHE_OPS) is not None, mi.KV_CACHE_OPS
    # mojo's importer still compiles the module under its final name (no staging name), so processes
    # importing it side by side on a fresh install race: build_kv_cache_ops first, in one process.
    importer = inspect.getsource(importlib.import_module("mojo.importer"))
    assert "_compile_mojo_to_so(root_mojo_path, expected_cache_file)" in importer, "it may build safely now"
    # Built in a child: loading it here would set PYTHONEXECUTABLE for every process this one starts
    # (the test workers' sys.executable became the `python3` on PATH).
    probe = f"import {mi.KV_CACHE_OPS}, subprocess; subprocess.run(['sh', '-c', 'echo $PYTHONEXECUTABLE'])"
    polluted = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=dict(os.environ))
    assert polluted.stdout.strip(), "loading it no longer sets PYTHONEXECUTABLE: build_kv_cache_ops may import it"
    # The build, in a process that has not loaded it: still not loaded there, nothing set for its children.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONEXECUTABLE"}
    after = ("import subprocess, sys; from model import max_internals as mi; mi.build_kv_cache_ops(); "
             "print(mi.KV_CACHE_OPS in sys.modules, flush=True); "
             "subprocess.run(['sh', '-c', 'echo $PYTHONEXECUTABLE'])")
    built = run_python("-c", after, env=dict(clean, PYTHONPATH=pythonpath(ROOT)))
    assert built.returncode == 0, built.stderr[-2000:]
    assert built.stdout.split("\n")[:2] == ["False", ""], f"build_kv_cache_ops loaded it here: {built.stdout!r}"
    # The kernels' import: a MAX without it fails tests/test_fast_linear.py's compile, naming it.
    for kernel in ("matmul.mojo", "q4_0.mojo"):
        text = (ROOT / "model" / "kernels" / kernel).read_text()
        assert f"from extensibility import {mi.FUSED_OUTPUT_TENSOR}" in text, kernel


def test_max_s_error_text_for_a_graph_op_it_refuses():
    from max.dtype import DType
    from max.experimental import functional as F
    from max.experimental.tensor import Tensor

    from checker import maxrun

    with maxrun.interpreter(), F.lazy(), pytest.raises(Exception) as raised:
        Tensor.zeros([2, 3], dtype=DType.float32) + Tensor.zeros([4, 5], dtype=DType.float32)
    text = str(raised.value)
    assert mi.OP_FAILED in text and mi.DIAGNOSTICS in text and mi.ADD_OP in text, text
    inputs = [m.groups() for m in map(mi.OP_INPUT.search, text.splitlines()) if m]
    assert len(inputs) == 2 and inputs[0][1] == "float32", text
    assert [mi.DIM.sub(r"\1", s) for s in mi.SHAPE.findall(text)][:2] == ["2, 3", "4, 5"], text


def test_no_other_file_reaches_for_a_private_name():
    allowed = {"model/max_internals.py", "tests/test_max_internals.py"}
    found = []
    for path in sorted(ROOT.glob("**/*.py")) + sorted(ROOT.glob("**/*.mojo")):
        name = str(path.relative_to(ROOT))
        if name in allowed or name.startswith((".", "build/")) or "/." in name:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if PRIVATE.search(code) and "max_internals" not in code and not _is_own_name(code):
                found.append(f"{name}:{number}: {line.strip()}")
    mojo_import = "from extensibility import _FusedOutputTensor"
    found = [f for f in found if not f.endswith(mojo_import + " as FusedOutputTensor")]
    assert not found, "MAX's private names outside model/max_internals.py:\n" + "\n".join(found)


def _is_own_name(code: str) -> bool:
    """``import _foo`` / ``from x import _foo`` of the project's own modules is not MAX's."""
    match = re.search(r"from (\S+) import", code)
    return bool(match) and not match[1].startswith("max")
