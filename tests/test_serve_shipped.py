"""The server's compiled graphs shipped with the project (serve/shipped.py): still
what ``python -m maintain make`` would ship for this code; handed to
MAX's engine only where this CPU runs them and its own kernels are the
same, and then taken only for the graphs built exactly as they were made.
The serving tests (test_serve.py) start from them on such a CPU."""

from __future__ import annotations

import json

import pytest

from artifacts import facts as artifact_facts
from artifacts import files
from artifacts.mef import MANIFEST
from maintain import server_graphs
from model import graph_source as portable
from model.max_internals import mef_store_fingerprint, mef_store_key
from serve import shipped
from serve.model_config import OPTIONS

V3 = shipped.TARGET.features()  # a CPU with exactly x86-64-v3's features: its own kernels take avx2


@pytest.fixture(autouse=True)
def engine_process_flag(monkeypatch):
    """prepare() sets model.cpu's process-wide as-shipped flag for good, as the engine's
    process must; restored after each test, so later tests in this process build this CPU's graphs."""
    monkeypatch.setattr(shipped.cpu, "_as_shipped", False)


def test_the_shipped_graphs_match_this_code(capsys):
    """A change to the server's model graph, the kernels or MAX makes this fail until they are made again."""
    for model in shipped.MODELS:
        assert server_graphs.stale(model, shipped.TARGET) == "", model
        facts = shipped.shipped_facts(model)
        assert (facts["kind"], facts["name"], facts["target"]) == (shipped.KIND, model, shipped.TARGET.cpu)
        folder = artifact_facts.folder(shipped.KIND, model, shipped.TARGET.name)
        manifest = json.loads((folder / MANIFEST).read_text())
        bodies = facts["made_from"]["bodies"]
        assert {entry["key"]: entry["fingerprint"] for entry in manifest["graphs"]} == bodies
        assert sorted(key.split("-")[0] for key in bodies) == ["GPT2EngineModule", "top_k_sampler"]
        assert all((folder / f["packed"]).is_file() for f in facts["files"])
    assert "python -m maintain make" in (artifact_facts.SHIPPED / "NOTICE").read_text()


def scaled(name: str, factor: float):
    """A graph ``name`` of one input times ``factor``: traced, never compiled."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops

    with Graph(name, input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as graph:
        graph.output(graph.inputs[0].tensor * ops.constant(factor, DType.float32, DeviceRef.CPU()))
    return graph


def test_only_a_graph_of_the_shipped_name_types_and_body_is_taken(tmp_path):
    made = scaled("served", 2.0)
    entry = {"key": mef_store_key(made), "name": made.name, "signature": {}, "fingerprint": mef_store_fingerprint(made)}
    (tmp_path / MANIFEST).write_text(json.dumps({"graphs": [entry], "artifacts": []}))
    key = shipped.matching_key([tmp_path])
    assert key(scaled("served", 2.0)) == entry["key"]
    assert key(scaled("served", 3.0)) is None  # the same name and types, another body: compiled
    assert key(scaled("other", 2.0)) is None


@pytest.mark.skipif(not portable.cpu.is_x86(), reason="x86-64-v3's graphs: an x86-64 host's")
def test_a_cpu_that_cannot_run_them_compiles_one_with_kernels_of_its_own_uses_them(monkeypatch):
    facts = shipped.shipped_facts("demo")
    monkeypatch.delenv(portable.USE, raising=False)
    monkeypatch.delenv(portable.cpu.ENV, raising=False)
    if portable.opted_out():
        pytest.skip(f"the shipped graphs are off in this run: {portable.opted_out()}")
    assert shipped.unusable(facts, V3) == ""
    assert shipped.unusable(facts, V3 - {"avx2"}) == "this CPU lacks avx2 (x86-64-v3 needs them)"
    assert shipped.unusable(facts, V3 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}) == ""
    assert shipped.unusable({**facts, "max": "0.1"}, V3).startswith("made with MAX 0.1")
    assert "Mojo kernels" in shipped.unusable({**facts, "made_from": {**facts["made_from"], "kernels": "x"}}, V3)
    monkeypatch.setenv(portable.USE, "0")
    assert shipped.unusable(facts, V3) == f"{portable.USE}=0"


def test_the_engine_gets_the_graphs_unpacked_once(new_project_cache, monkeypatch):
    from max.engine import InferenceSession

    monkeypatch.setattr(shipped, "unusable", lambda facts, cpu_flags=None: "")
    monkeypatch.setattr(InferenceSession, "default_mef_store", None)
    monkeypatch.setenv(OPTIONS, json.dumps({"device": "cpu"}))
    monkeypatch.setattr(shipped.cpu, "native_path", lambda cpu_flags=None: "avx2")
    said = shipped.prepare()
    assert "shipped compiled graphs (x86-64-v3" in said and portable.USE not in said
    assert shipped.cpu.one_row_tiles() == {}  # the graphs are built as they were shipped
    # a CPU whose own kernels take another path uses them too, and is told how to get its own
    monkeypatch.setattr(shipped.cpu, "native_path", lambda cpu_flags=None: "avx512-vnni")
    assert shipped.prepare().endswith(f"(this CPU's own kernel path is avx512-vnni, theirs avx2: {portable.USE}=0 "
                                      "compiles this CPU's own)")
    store = InferenceSession.default_mef_store
    assert store is not None and not store.exporting
    folders = sorted((new_project_cache / "shipped").glob(f"{shipped.KIND}-*"))
    assert len(folders) == len(shipped.MODELS)
    for model, where in zip(sorted(shipped.MODELS), folders, strict=True):
        assert files.intact(where, shipped.shipped_facts(model)["files"], digests=True)
    written = {mef: mef.stat().st_mtime_ns for where in folders for mef in where.glob("*.mef")}
    shipped.prepare()
    assert sorted((new_project_cache / "shipped").glob(f"{shipped.KIND}-*")) == folders
    assert {mef: mef.stat().st_mtime_ns for mef in written} == written  # not unpacked again
    damaged = next(iter(written))
    damaged.write_bytes(damaged.read_bytes()[:1000])  # cut short: set aside, unpacked again, whole
    shipped.prepare()
    for model, where in zip(sorted(shipped.MODELS), folders, strict=True):
        assert files.intact(where, shipped.shipped_facts(model)["files"], digests=True)


def test_only_the_models_whose_own_facts_pass_are_given(new_project_cache, monkeypatch):
    from max.engine import InferenceSession

    monkeypatch.setattr(shipped, "unusable", lambda facts, cpu_flags=None: "stale" if facts["name"] == "gpt2" else "")
    monkeypatch.setattr(InferenceSession, "default_mef_store", None)
    monkeypatch.setenv(OPTIONS, json.dumps({"device": "cpu"}))
    shipped.prepare()
    [given] = (new_project_cache / "shipped").glob(f"{shipped.KIND}-*")
    assert given.name.startswith(f"{shipped.KIND}-demo-")
    assert shipped.start_note("cpu").startswith("the graphs shipped for x86-64-v3 serve demo as built")
    monkeypatch.setattr(shipped, "unusable", lambda facts, cpu_flags=None: "stale" if facts["name"] == "demo" else "")
    assert shipped.start_note("cpu").startswith("the graphs shipped for x86-64-v3 serve gpt2 as built")


def test_where_they_cannot_serve_the_engine_is_told_nothing_and_the_log_says_why(monkeypatch):
    from max.engine import InferenceSession

    monkeypatch.setattr(InferenceSession, "default_mef_store", None)
    monkeypatch.setattr(shipped, "unusable", lambda facts, cpu_flags=None: "this CPU lacks avx2")
    monkeypatch.setenv(OPTIONS, json.dumps({"device": "cpu"}))
    assert shipped.prepare() == "not using the server's shipped compiled graphs: this CPU lacks avx2"
    monkeypatch.setenv(OPTIONS, json.dumps({"device": "gpu", "dtype": "float32"}))
    assert shipped.prepare() == "the server's shipped compiled graphs are for the CPU"
    assert InferenceSession.default_mef_store is None
    compiles = "the first start compiles the graph: minutes on a small CPU; later starts reuse it"
    assert shipped.start_note("cpu") == compiles and shipped.start_note("gpu") == compiles
    monkeypatch.setattr(shipped, "unusable", lambda facts, cpu_flags=None: "")
    assert shipped.start_note("cpu").startswith("the graphs shipped for x86-64-v3 serve demo and gpt2")
