"""Saved graphs (model/saved_graphs.py): the second load of a model reads the
MEF the first one wrote instead of compiling, and runs the same."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from checkpoints import TINY, reference, write_checkpoint
from conftest import run_python
from suite_graphs import Q8_0_TRAINED, saved_in

from checker import oracle
from model import caches, saved_graphs
from model.gpt2 import load_gpt2
from model.options import BuildOptions
from solutions.solution_01 import GPT2Config
from weights import load_state, read_config

# The app tests' tiny checkpoint: its float32 graph is the one the suite compiles alone
# (tests/suite_graphs.py), which a new project cache finds in MAX's cache.
IDS = np.array([[464, 3290, 318, 257, 1310, 286, 262, 3504]])


@pytest.fixture
def tiny(tmp_path) -> tuple:
    """The tiny checkpoint's folder and the oracle's logits for ``IDS``."""
    folder = write_checkpoint(tmp_path / "tiny", TINY)
    return folder, oracle.lm_logits(IDS, load_state(folder, read_config(folder)), TINY["n_head"])[0]


@pytest.fixture
def suite_graph_folder() -> Path:
    """The suite's graphs folder, where its units are saved (tests/suite_graphs.py): asked for
    before ``new_project_cache`` points the project cache elsewhere."""
    if not caches.enabled():
        pytest.skip("saved graphs are off (GPT2_MAX_SAVED_GRAPHS=0)")
    return caches.folder("graphs")


@pytest.fixture
def q8_0_saved(suite_graph_folder, request, tmp_path) -> tuple:
    """A copy of trained-bytes, its reference, and a project cache of this test's own that
    holds its q8_0 graph as the suite's group compiled it (compiled alone it is minutes)."""
    import shutil

    project_cache = request.getfixturevalue("new_project_cache")
    saved_in(Q8_0_TRAINED, project_cache, suite_graph_folder)
    source, _, ref = reference("trained-bytes")
    return shutil.copytree(source, tmp_path / "ckpt"), ref, project_cache


def test_second_load_reads_the_saved_graph(new_project_cache, tiny, capsys):
    folder, expected = tiny
    first = load_gpt2(folder, device="cpu", with_tokenizer=False)
    compiling = capsys.readouterr().err  # a compile says so first, and how long it took after
    assert "compiling the model graph (seconds when MAX's caches are warm; the first time" in compiling
    assert "compiled in" in compiling
    second = load_gpt2(folder, device="cpu", with_tokenizer=False)
    assert "compiling" not in capsys.readouterr().err  # a saved graph is not compiled
    assert not first.saved_graph and second.saved_graph
    [saved] = (new_project_cache / "graphs").iterdir()  # one folder, no staging left behind
    assert saved.name.startswith("gpt2_") and (saved / "manifest.json").is_file()
    assert json.loads((saved / "facts.json").read_text()) == {"quantized_layers": 0, "quantized": {}}
    assert type(second.compiled).__name__ == "SavedGraph"  # driven directly: nothing traced
    logits = second.forward_logits(IDS)
    np.testing.assert_array_equal(logits, first.forward_logits(IDS))
    assert np.abs(logits - expected).max() <= 1e-4
    step, _ = second.step(IDS, second.empty_cache(1))
    np.testing.assert_array_equal(step, first.step(IDS, first.empty_cache(1))[0])


def test_a_saved_graph_can_also_be_found_by_tracing(new_project_cache, tiny, monkeypatch, capsys):
    """bfloat16's path (a GPU: its weights are cast by the compile call, so
    its saved graph is looked up by tracing, not driven directly), run here
    on the CPU in float32."""
    folder, _ = tiny
    first = load_gpt2(folder, device="cpu", with_tokenizer=False)
    real = saved_graphs.store_for
    monkeypatch.setattr(saved_graphs, "store_for", lambda name, device, direct=True: real(name, device, direct=False))
    capsys.readouterr()
    second = load_gpt2(folder, device="cpu", with_tokenizer=False)
    assert "compiling" not in capsys.readouterr().err and second.saved_graph
    assert type(second.compiled).__name__ != "SavedGraph"
    np.testing.assert_array_equal(second.forward_logits(IDS), first.forward_logits(IDS))


def test_switched_off(new_project_cache, tiny, monkeypatch):
    monkeypatch.setenv("GPT2_MAX_SAVED_GRAPHS", "0")
    folder, _ = tiny
    assert not load_gpt2(folder, device="cpu", with_tokenizer=False).saved_graph
    assert not (new_project_cache / "graphs").exists()


def test_the_name_follows_everything_that_shapes_the_graph(tmp_path, monkeypatch):
    config, cpu = GPT2Config(n_layer=2), BuildOptions(device="cpu", dtype="float32")
    name = saved_graphs.graph_name(cpu, config)
    assert name == saved_graphs.graph_name(BuildOptions(device="cpu", dtype="float32"), config)
    others = [
        saved_graphs.graph_name(replace(cpu, impl="steps"), config),
        saved_graphs.graph_name(cpu, replace(config, n_layer=3)),
        saved_graphs.graph_name(replace(cpu, dtype="q4_0"), config),
        saved_graphs.graph_name(replace(cpu, attention_layer=1), config),
        saved_graphs.graph_name(replace(cpu, cache="concat"), config),
        saved_graphs.graph_name(replace(cpu, linear="course"), config),
    ]
    assert name not in others and len(set(others)) == len(others)
    # A change to a file the build imports, at any depth, gives a new name; to one it does not, none.
    monkeypatch.setattr(saved_graphs, "ROOT", tmp_path)
    (tmp_path / "model" / "layers").mkdir(parents=True)
    (tmp_path / "model" / "graph.py").write_text("def build():\n    from model.layers import few_rows\n")
    (tmp_path / "model" / "layers" / "few_rows.py").write_text("a = 1\n")
    (tmp_path / "model" / "cli.py").write_text("from model import graph\n")
    before = saved_graphs.graph_name(cpu, config)
    (tmp_path / "model" / "cli.py").write_text("from model import graph  # the command line, reworded\n")
    assert saved_graphs.graph_name(cpu, config) == before
    (tmp_path / "model" / "layers" / "few_rows.py").write_text("a = 2\n")
    assert saved_graphs.graph_name(cpu, config) != before


def test_the_files_that_build_a_graph_are_the_build_s_imports():
    """Read from the code: the build and the layers, kernels and course loader it imports; not the
    command line, the tools or where a graph comes from."""
    built = {p.relative_to(saved_graphs.ROOT).as_posix() for p in saved_graphs.build_files()}
    assert {"model/graph.py", "model/layers/few_rows.py", "model/kv_cache.py", "model/course.py"} <= built
    assert not built & {"model/cli.py", "model/doctor.py", "model/graph_source.py", "model/generate.py"}


def test_the_learner_s_own_steps_name_the_graph(tmp_path, monkeypatch):
    """With ``impl="steps"`` the graph is named by the step files Python
    imports (a learner's folder first on the path), not by the repository's
    skeletons: a change there must not find a graph saved before it."""
    import model.course

    config, steps = GPT2Config(n_layer=2), BuildOptions(device="cpu", dtype="float32", impl="steps")
    folder = tmp_path / "steps"
    folder.mkdir()
    (folder / "step_07.py").write_text("a = 1\n")
    monkeypatch.setattr(model.course, "steps_folder", lambda: folder)
    before = saved_graphs.graph_name(steps, config)
    (folder / "step_07.py").write_text("a = 2\n")
    assert saved_graphs.graph_name(steps, config) != before


def test_quantized_blocks_are_saved_once_per_checkpoint(q8_0_saved):
    import os

    folder, ref, project_cache = q8_0_saved
    first = load_gpt2(folder, device="cpu", dtype="q8_0", with_tokenizer=False)
    [saved] = (project_cache / "quantized").iterdir()
    assert len(list(saved.glob("*.npy"))) == 2 * first.quantized_layers > 0  # each layer's codes and scales
    second = load_gpt2(folder, device="cpu", dtype="q8_0", with_tokenizer=False)
    assert first.saved_graph and second.saved_graph  # the unit's graph both times
    assert second.quantized_layers == first.quantized_layers  # the unit's facts
    np.testing.assert_array_equal(second.forward_logits(ref["ids"]), first.forward_logits(ref["ids"]))
    # A checkpoint file that changed gets its own blocks.
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    load_gpt2(folder, device="cpu", dtype="q8_0", with_tokenizer=False)
    assert len(list((project_cache / "quantized").iterdir())) == 2


def test_a_saved_q8_0_graph_runs_directly(q8_0_saved, monkeypatch):
    """The custom Q8_0 kernel's weights (int8 codes, float16 scales as uint16
    bits) reach a saved graph as the graph takes them (given as raw numpy
    arrays they crashed it at the first call): trained-bytes' logits as
    float32's to within q8_0's rounding, every position's likeliest token the
    same; and a saved quantized graph starts without building the course's
    model, even when its blocks must be made again."""
    import shutil

    folder, ref, project_cache = q8_0_saved
    first = load_gpt2(folder, device="cpu", dtype="q8_0", with_tokenizer=False)
    import model.graph

    def not_built(*args, **kwargs):
        raise AssertionError("the course's model was built for a saved graph")

    monkeypatch.setattr(model.graph, "build_lm", not_built)  # which layers are quantized: in the graph's facts
    shutil.rmtree(project_cache / "quantized")  # so the blocks are made again from those facts
    second = load_gpt2(folder, device="cpu", dtype="q8_0", with_tokenizer=False)
    assert type(second.compiled).__name__ == "SavedGraph" and second.quantized_layers == first.quantized_layers > 0
    ids = ref["ids"][:1, :5]
    logits = second.forward_logits(ids)
    np.testing.assert_array_equal(logits, first.forward_logits(ids))
    expected = ref["logits"][:1, :5]
    assert np.abs(logits - expected).max() <= 0.02 * np.abs(expected).max()  # q8_0: 0.4% here, 0.8% at every position
    np.testing.assert_array_equal(logits.argmax(-1), expected.argmax(-1))
    step, _ = second.step(ids, second.empty_cache(1, 8))
    np.testing.assert_array_equal(step, first.step(ids, first.empty_cache(1, 8))[0])


def test_a_quantized_graph_saved_alone_keeps_what_its_unit_kept(suite_graph_folder, request, monkeypatch):
    """The facts a user's own compile of a quantized build writes beside its
    graph (model/gpt2.py) are those the suite's unit wrote for it
    (model/together.py), which the q8_0 tests above load; traced here, not
    compiled (a lone q8_0 compile is minutes)."""
    from suite_graphs import graph_name

    import model.graph

    name = graph_name(Q8_0_TRAINED)
    unit = json.loads((suite_graph_folder / name / saved_graphs.FACTS).read_text())
    project_cache = request.getfixturevalue("new_project_cache")
    monkeypatch.setattr(model.graph, "compile_graph",
                        lambda graph, config, options, weights, store: model.graph.trace_graph(graph, config, options))
    load_gpt2(reference("trained-bytes")[0], device="cpu", dtype="q8_0", with_tokenizer=False)
    alone = json.loads((project_cache / "graphs" / name / saved_graphs.FACTS).read_text())
    assert alone["quantized_layers"] > 0 and alone["quantized"]
    assert alone == {key: value for key, value in unit.items() if key != "bundle"}


class Artifact:
    """Stands in for MAX's compiled artifact: ``export_mef`` writes a file."""

    def export_mef(self, path) -> None:
        path.write_bytes(b"a bundle")


def test_a_bundles_graphs_are_each_saved_by_name(new_project_cache):
    """Graphs compiled as one unit (model/together.py) are saved as one bundle;
    each graph's folder holds its facts, naming the bundle, its graph there and
    its weights' prefix. A graph saved already is left as it was."""
    graphs = new_project_cache / "graphs"
    (graphs / "gpt2_b").mkdir(parents=True)
    (graphs / "gpt2_b" / "facts.json").write_text('{"quantized_layers": 0}')
    (graphs / "gpt2_b" / "manifest.json").write_text("{}")  # (with its MEF, saved alone)
    members = [(name, {"quantized_layers": 0, "quantized": {}, "bundle": {"graph": graph, "prefix": prefix}})
               for name, graph, prefix in [("gpt2_a", "gpt2_0", "builds.0."), ("gpt2_b", "gpt2_1", "builds.1.")]]
    assert not saved_graphs.is_saved("gpt2_a")
    saved_graphs.keep_bundle(Artifact(), members, {"gpt2_0": ["builds.0.lm.w"], "gpt2_1": ["builds.1.lm.w"]})
    facts = json.loads((graphs / "gpt2_a" / "facts.json").read_text())
    mef = saved_graphs.bundle_mef(facts)
    assert facts["bundle"]["graph"] == "gpt2_0" and facts["bundle"]["prefix"] == "builds.0."
    assert mef.read_bytes() == b"a bundle" and mef.parent.name == facts["bundle"]["name"]
    assert json.loads((mef.parent / "weights.json").read_text())["gpt2_1"] == ["builds.1.lm.w"]
    assert saved_graphs.is_saved("gpt2_a")
    assert json.loads((graphs / "gpt2_b" / "facts.json").read_text()) == {"quantized_layers": 0}  # kept
    assert sorted(p.name for p in graphs.iterdir()) == sorted(["gpt2_a", "gpt2_b", facts["bundle"]["name"]])
    mef.unlink()  # a bundle gone: its graphs are no longer saved, and a later unit saves them again
    assert not saved_graphs.is_saved("gpt2_a")
    saved_graphs.keep_bundle(Artifact(), members[:1], {"gpt2_0": ["builds.0.lm.w"]})
    again = json.loads((graphs / "gpt2_a" / "facts.json").read_text())["bundle"]["name"]
    assert again != facts["bundle"]["name"] and saved_graphs.is_saved("gpt2_a")


def linear_other(width: int, seed: int):
    """A graph that is not a GPT-2 build: one nn.Linear 4 -> ``width``, its weights drawn from ``seed``."""
    from max.driver import CPU
    from max.dtype import DType
    from max.experimental import functional as F
    from max.experimental import nn
    from max.experimental.tensor import default_device, default_dtype
    from max.graph import TensorType

    from model.together import Other

    # The dtype and device set, as every build sets them: MAX's defaults are
    # process state, which another test in the same process may have changed.
    with F.lazy(), default_dtype(DType.float32), default_device(CPU()):
        module = nn.Linear(4, width)
    rng = np.random.default_rng(seed)
    weights = {"weight": rng.standard_normal((width, 4)).astype(np.float32),
               "bias": rng.standard_normal(width).astype(np.float32)}
    return Other(module, [TensorType(DType.float32, ["rows", 4], device=CPU())], weights)


def test_a_graph_that_is_not_a_model_s_is_named_by_what_it_computes(new_project_cache):
    """A unit's graph that is not a GPT-2 build (model/together.py's Other) is
    saved under a name taken from its traced body: the same module made again,
    other weights, gives the same name, in another process too (the suite's
    other worker finds it so); another shape another. Nothing saved under it
    here: ``saved()`` says so and compiles nothing."""
    first = linear_other(3, 0)
    assert first.name.startswith("graph_")
    assert linear_other(3, 1).name == first.name
    assert linear_other(5, 0).name != first.name
    assert first.saved() is None
    child = run_python("-c", "import sys; sys.path.insert(0, 'tests'); from test_saved_graphs import linear_other, "
                       "name_parts; print(name_parts()); print(linear_other(3, 2).name)")
    assert child.returncode == 0, child.stderr[-2000:]
    # On a mismatch, which of the name's parts differs between the two processes.
    assert child.stdout.split()[-1] == first.name, (name_parts(), child.stdout.splitlines()[-2])


def name_parts() -> str:
    """What a unit's graph name is made of beside its traced body (model/together.py's Other.name)."""
    from model.graph_source import kernels_digest
    from model.saved_graphs import machine_facts

    return json.dumps({**machine_facts(), "kernels": kernels_digest()}, sort_keys=True)
