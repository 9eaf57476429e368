"""The app's compiled graphs shipped with the project (shipped/app-graph/), the
demo's and GPT-2 124M's: still what ``python -m maintain make`` would ship for
this code, used on a first run with empty caches where the CPU can run them
(model/graph_source.py), and refused, saying why, where they cannot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from types import SimpleNamespace

import numpy as np
import pytest
from checkpoints import demo_reference
from conftest import pythonpath

from artifacts import facts as artifact_facts
from artifacts import files
from artifacts import targets as artifact_targets
from artifacts.facts import why_not_here
from checker import oracle
from checker.skeleton import ROOT
from maintain import app_graphs
from model import caches
from model import graph_source as portable
from model.options import BuildOptions
from weights import load_state, load_tokenizer, read_config

TARGETS = artifact_targets.SHIPPED
X86, ARM = TARGETS["x86-64-v3"], TARGETS["neoverse-n1"]
SHIPPED = [(model, level) for model in portable.MODELS for level in TARGETS]


def unusable_here(facts, features=None) -> str:
    return portable.opted_out() or why_not_here(facts, features)


def unpack(facts, folder):
    """What a first run unpacks: the compressed MEF, MAX's manifest naming it, the build's facts."""
    shipped = artifact_facts.folder(portable.KIND, facts["name"], facts["level"])
    return files.unpack(shipped, facts["files"], folder,
                        {portable.saved_graphs.FACTS: json.dumps(facts["made_from"]["build"])})


def test_the_shipped_graphs_match_this_code(capsys):
    """A change to the model's graph makes this fail until the graphs are made again."""
    for model, level in SHIPPED:
        target = TARGETS[level]
        assert app_graphs.stale(model, target) == "", (model, level)
        facts = portable.shipped_facts(model, target)
        assert (facts["kind"], facts["name"], facts["level"], facts["target"]) == (portable.KIND, model, level,
                                                                                    target.cpu)
        folder = artifact_facts.folder(portable.KIND, model, level)
        assert all((folder / f["packed"]).is_file() for f in facts["files"])
    assert (artifact_facts.SHIPPED / "NOTICE").is_file()
    assert (artifact_facts.SHIPPED / "MAX-LICENSE.txt").stat().st_size > 0


# GPT-2 124M's config.json on Hugging Face's hub (openai-community/gpt2), as a download has it.
HUB_GPT2_CONFIG = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
    "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}


def test_gpt2_s_shipped_graph_is_the_one_a_hub_download_builds(tmp_path):
    """``--model gpt2`` reads the hub's config.json: its config must be the shipped graph's, the graph's
    shape the checkpoint's (the bench's random checkpoint writes the same)."""
    from model.course import config_class

    (tmp_path / "config.json").write_text(json.dumps(HUB_GPT2_CONFIG))
    downloaded = read_config(tmp_path, config_class("solutions"))
    facts = portable.shipped_facts("gpt2", X86)
    shipped = portable.config_facts(app_graphs.shipped_config("gpt2"))
    assert portable.config_facts(downloaded) == facts["made_from"]["config"] == shipped
    assert portable.is_the_shipped_build(facts, BuildOptions(device="cpu"), downloaded)
    assert portable.shipped_for(BuildOptions(device="cpu"), downloaded, X86) == facts
    assert portable.shipped_for(BuildOptions(device="cpu"), demo_config(), X86)["name"] == "demo"


def test_each_shipped_target_is_one_the_targets_check_compiles_and_names_its_kernel_path(monkeypatch):
    from maintain import targets

    assert targets.TARGETS is artifact_targets.TARGETS  # one table
    for target in TARGETS.values():
        monkeypatch.setattr(portable.cpu, "is_x86", lambda target=target: target.machine == "x86_64")
        assert portable.cpu.native_path(target.features()) == target.path, target.name


def demo_config():
    return app_graphs.shipped_config("demo")


def never_traced():
    raise AssertionError("traced, though the sources are the ones the graph was made from")


@pytest.fixture
def host_read_again():
    """Asked for before monkeypatch, so torn down after it: what was read of a mocked machine is
    forgotten, and the next caller reads this machine's (archspec and this project keep it)."""
    import archspec.cpu.detect

    yield
    for cached in (artifact_targets.host_features, archspec.cpu.detect._machine, archspec.cpu.host,
                   portable.cpu.microarchitecture):
        cached.cache_clear()


def on(monkeypatch, system: str, machine: str) -> None:
    monkeypatch.setattr(portable.platform, "system", lambda: system)
    monkeypatch.setattr(portable.platform, "machine", lambda: machine)
    monkeypatch.setattr(portable.cpu, "is_x86", lambda: machine in ("x86_64", "AMD64"))


def test_each_machine_is_offered_its_architecture_s_graph_and_others_told_why(host_read_again, monkeypatch):
    """Linux on x86-64 and on Arm each get their own; elsewhere none is offered, and each refusal says why."""
    made_with = artifact_facts.max_version()

    def cannot_run(target, features):
        return why_not_here({"max": made_with, "level": target.name}, features)

    for system, machine, target in (("Linux", "x86_64", X86), ("Linux", "aarch64", ARM),
                                    ("Darwin", "arm64", None), ("Linux", "riscv64", None)):
        on(monkeypatch, system, machine)
        assert portable.this_machines() is target, machine
        if target:
            assert cannot_run(target, target.features()) == "", machine
    assert cannot_run(X86, X86.features()) == "Linux x86_64 code, this is Linux on riscv64"
    on(monkeypatch, "Darwin", "arm64")
    assert cannot_run(ARM, ARM.features()) == "Linux aarch64 code, this is Darwin on arm64"
    on(monkeypatch, "Linux", "aarch64")
    assert cannot_run(ARM, ARM.features() - {"asimddp"}) == "this CPU lacks asimddp (neoverse-n1 needs them)"
    assert cannot_run(ARM, frozenset()) == "this CPU's features could not be read"
    assert cannot_run(X86, X86.features()) == "Linux x86_64 code, this is Linux on aarch64"
    assert why_not_here({"max": "0.0", "level": "x86-64-v3"}, X86.features()).startswith("made with MAX 0.0")


# /proc/cpuinfo's first processor on an AWS Graviton2 (Neoverse N1), as Linux 6 lists it.
GRAVITON2 = """processor	: 0
BogoMIPS	: 243.75
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer	: 0x41
CPU part	: 0xd0c
"""


def test_an_arm_cpu_s_features_line_is_read_and_takes_the_arm_graph(host_read_again, tmp_path, monkeypatch, capsys):
    """On a mocked Graviton2: the Features line read from /proc/cpuinfo (by archspec), the Neoverse N1
    graph unpacked and named, no background compile (its own path is the graph's)."""
    info = tmp_path / "cpuinfo"
    info.write_text(GRAVITON2)
    real_open = open
    import archspec.cpu.detect

    on(monkeypatch, "Linux", "aarch64")
    artifact_targets.host_features.cache_clear()
    archspec.cpu.detect._machine.cache_clear()  # (archspec keeps the architecture it read first)
    try:
        with monkeypatch.context() as m:
            m.setattr("builtins.open", lambda path, *a, **k: real_open(info if path == "/proc/cpuinfo" else path,
                                                                       *a, **k))
            read = artifact_targets.host_features()
    finally:
        artifact_targets.host_features.cache_clear()
    assert read >= ARM.features() and "ssbs" in read
    monkeypatch.setattr(portable.cpu, "flags", lambda: read)
    monkeypatch.setattr(artifact_targets, "host_features", lambda: read)
    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path / "cache"))
    for name in (portable.USE, "GPT2_MAX_KERNEL_PATH", "GPT2_MAX_SAVED_GRAPHS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(portable, "compile_own_in_background",
                        lambda options, checkpoint: pytest.fail("compiled its own"))
    # (an edited source would trace: tested below)
    sources = portable.shipped_facts("demo", ARM)["made_from"]["sources"]
    monkeypatch.setattr(portable.saved_graphs, "sources_digest", lambda impl: sources)
    name = portable.shipped_name(BuildOptions(device="cpu"), demo_config(), never_traced, "demo")
    assert name and portable.saved_graphs.is_saved(name)
    assert f"{portable.USING} (neoverse-n1:" in capsys.readouterr().err


def test_where_no_level_ships_a_first_run_says_so_unless_turned_off(host_read_again, monkeypatch, capsys):
    on(monkeypatch, "Darwin", "arm64")
    for name in (portable.USE, "GPT2_MAX_KERNEL_PATH", "GPT2_MAX_SAVED_GRAPHS"):
        monkeypatch.delenv(name, raising=False)
    assert portable.shipped_name(BuildOptions(device="cpu"), demo_config(), never_traced, "demo") is None
    assert capsys.readouterr().err == (f"not {portable.USING}: none is shipped for Darwin on arm64 "
                                       "(Linux on x86-64-v3 or neoverse-n1 only)\n")
    monkeypatch.setenv(portable.USE, "0")
    assert portable.shipped_name(BuildOptions(device="cpu"), demo_config(), never_traced, "demo") is None
    assert capsys.readouterr().err == f"not {portable.USING}: {portable.USE}=0\n"


@pytest.mark.parametrize(("model", "level"), SHIPPED)
def test_each_shipped_graph_unpacks_into_a_saved_graph(model, level, tmp_path):
    """The compressed MEF, MAX's manifest naming it, and the build's facts: what a first run unpacks."""
    facts = portable.shipped_facts(model, TARGETS[level])
    folder = unpack(facts, tmp_path / "graph")
    [graph] = json.loads((folder / portable.saved_graphs.MANIFEST).read_text())["graphs"]
    [mef] = [f for f in facts["files"] if f["name"] == graph["key"]]
    assert (folder / mef["name"]).stat().st_size == mef["bytes"] and files.sha256(folder / mef["name"]) == mef["sha256"]
    assert json.loads((folder / portable.saved_graphs.FACTS).read_text()) == facts["made_from"]["build"]


def test_a_damaged_shipped_file_is_not_unpacked(tmp_path, monkeypatch):
    """A truncated file (a bad checkout, a full disk) leaves no saved graph: the app then compiles."""
    facts = portable.shipped_facts("demo", X86)
    shipped = artifact_facts.folder(portable.KIND, "demo", X86.name)
    damaged = tmp_path / "shipped"
    damaged.mkdir()
    for f in facts["files"]:
        (damaged / f["packed"]).write_bytes((shipped / f["packed"]).read_bytes())
    [mef] = [f for f in facts["files"] if f["packed"].endswith(".xz")]
    (damaged / mef["packed"]).write_bytes((shipped / mef["packed"]).read_bytes()[:1000])  # cut short
    assert files.unpack(damaged, facts["files"], tmp_path / "graphs" / "g") is None
    assert not (tmp_path / "graphs" / "g").exists() and list((tmp_path / "graphs").iterdir()) == []
    (damaged / "manifest.json").write_text("{}")  # whole xz files, bytes that are not the shipped ones
    (damaged / mef["packed"]).write_bytes((shipped / mef["packed"]).read_bytes())
    assert files.unpack(damaged, facts["files"], tmp_path / "graphs" / "g") is None
    assert list((tmp_path / "graphs").iterdir()) == []


@pytest.mark.parametrize(("model", "level"), SHIPPED)
def test_only_the_default_cpu_build_of_the_model_s_shape_is_shipped(model, level):
    facts, config = portable.shipped_facts(model, TARGETS[level]), app_graphs.shipped_config(model)
    assert portable.is_the_shipped_build(facts, BuildOptions(device="cpu"), config)
    for other in (BuildOptions(device="cpu", dtype="q8_0"), BuildOptions(device="cpu", linear="course"),
                  BuildOptions(device="cpu", cache="concat"), BuildOptions(device="cpu", attention_layer=0),
                  BuildOptions(device="cpu", impl="steps")):
        assert not portable.is_the_shipped_build(facts, other, config), other
    deeper = replace(config, n_layer=config.n_layer + 1)
    assert not portable.is_the_shipped_build(facts, BuildOptions(device="cpu"), deeper)


def only_where_a_level_ships():
    if not portable.this_machines():
        pytest.skip(portable.none_shipped_here())


def test_a_cpu_without_the_targets_features_is_told_why(monkeypatch):
    only_where_a_level_ships()
    facts = portable.shipped_facts("demo")
    monkeypatch.delenv(portable.USE, raising=False)
    monkeypatch.delenv("GPT2_MAX_KERNEL_PATH", raising=False)
    features = portable.this_machines().features()
    if portable.cpu.is_x86():
        assert "avx2" in unusable_here(facts, frozenset({"sse4_2", "avx"}))
        assert unusable_here(facts, features) == ""
    assert "MAX 0.0" in unusable_here({**facts, "max": "0.0"}, features)
    monkeypatch.setenv(portable.USE, "0")
    assert unusable_here(facts, features) == f"{portable.USE}=0"


def test_a_first_run_with_empty_caches_uses_the_shipped_graph(tmp_path):
    """The app with every cache folder empty: the shipped graph, not a
    compile, and the tokens HF's greedy search gives; the second run loads
    it as a saved graph."""
    only_where_a_level_ships()
    why = unusable_here(portable.shipped_facts("demo"))
    if why:
        pytest.skip(f"the shipped graph cannot run here: {why}")
    env = {k: v for k, v in os.environ.items() if k not in ("GPT2_MAX_CACHE", "MODULAR_CACHE_DIR")}
    # (no background compile of this CPU's own graph: it would outlive the test, and a second run could take it)
    env.update(XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=pythonpath(ROOT), **{portable.BACKGROUND: "0"})
    ref = demo_reference()
    for run in range(2):
        done = subprocess.run([sys.executable, "-m", "model", "--model", "demo", "--temperature", "0",
                               "--max-new-tokens", "8", "--json", "And it came to pass"],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert portable.USING in done.stderr and "compiling the model graph" not in done.stderr, (
            run, done.stderr)
        tokens = json.loads(done.stdout.strip().splitlines()[-1])["tokens"]
        np.testing.assert_array_equal(tokens, ref["greedy"][0][:8])


def test_a_finished_course_s_first_run_with_empty_caches_uses_the_shipped_graph(tmp_path):
    """``--impl steps`` with every step finished traces the solutions' graph
    exactly: the first run, every cache empty, finds the shipped graph by
    tracing both and gives the solutions' tokens; the second finds it under
    the steps' own name, tracing nothing."""
    from checkpoints import learner_tree

    only_where_a_level_ships()
    why = unusable_here(portable.shipped_facts("demo"))
    if why:
        pytest.skip(f"the shipped graph cannot run here: {why}")
    cwd, env = learner_tree(tmp_path, finished=True)
    env = {k: v for k, v in env.items() if k not in ("GPT2_MAX_CACHE", "MODULAR_CACHE_DIR")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), **{portable.BACKGROUND: "0"})
    ref = demo_reference()
    for run in range(2):
        done = subprocess.run([sys.executable, "-m", "model", "--impl", "steps", "--model", "demo", "--temperature",
                               "0", "--max-new-tokens", "8", "--json", "And it came to pass"],
                              capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "compiling the model graph" not in done.stderr, (run, done.stderr)
        assert ("your steps build the solutions' graph exactly" in done.stderr) == (run == 0), (run, done.stderr)
        tokens = json.loads(done.stdout.strip().splitlines()[-1])["tokens"]
        np.testing.assert_array_equal(tokens, ref["greedy"][0][:8])


def test_gpt2_s_first_run_with_empty_caches_uses_its_shipped_graph(tmp_path):
    """``--model`` a GPT-2 124M checkpoint (the bench's random one: the graph holds no weights) with every
    cache folder empty: the shipped graph, not a compile, and the numpy oracle's greedy tokens."""
    only_where_a_level_ships()
    why = unusable_here(portable.shipped_facts("gpt2"))
    if why:
        pytest.skip(f"the shipped graph cannot run here: {why}")
    folder = caches.random_checkpoint("gpt2")
    env = {k: v for k, v in os.environ.items() if k not in ("GPT2_MAX_CACHE", "MODULAR_CACHE_DIR")}
    # (no background compile of this CPU's own graph: it would outlive the test, and a second run could take it)
    env.update(XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=pythonpath(ROOT), **{portable.BACKGROUND: "0"})
    done = subprocess.run([sys.executable, "-m", "model", "--model", str(folder), "--temperature", "0",
                           "--max-new-tokens", "4", "--json", "And it came to pass"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert portable.USING in done.stderr and "compiling the model graph" not in done.stderr, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ids = load_tokenizer(folder).encode(result["prompt"])
    assert len(ids) == result["prompt_tokens"]
    weights = load_state(folder, read_config(folder))
    assert result["tokens"] == oracle.greedy(ids, weights, 12, 4)


def test_a_background_compile_of_this_cpus_own_graph(tmp_path, monkeypatch):
    """Where this CPU's kernel path is not the target's: one niced child, not
    started while another holds the lock, and that the opt-out and CI both stop."""
    from filelock import FileLock

    started = []

    class Child:
        def __init__(self, command, **kwargs):
            started.append((command, kwargs))

    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(portable.BACKGROUND, raising=False)
    monkeypatch.setattr(portable.subprocess, "Popen", Child)
    options = BuildOptions(device="cpu")
    portable.compile_own_in_background(options, "demo")
    assert len(started) == 1
    command, kwargs = started[0]
    assert command[1:3] == ["-m", "model.own_graph"] and command[-1] == "demo" and kwargs["start_new_session"]
    assert kwargs["env"][portable.USE] == "0" and callable(kwargs["preexec_fn"])
    with FileLock(tmp_path / "graphs" / portable.OWN_LOCK):  # one compiling: none started beside it
        portable.compile_own_in_background(options, "demo")
    assert len(started) == 1
    for env in ({portable.BACKGROUND: "0"}, {"CI": "true"}):
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            portable.compile_own_in_background(options, "demo")
        assert len(started) == 1, env


def test_the_first_run_to_load_the_background_compiled_graph_says_so(tmp_path, monkeypatch, capsys):
    """The background child (``python -m model.own_graph``) leaves a line for the run that first
    loads the graph it saved: that run says it, later ones nothing."""
    from max.driver import CPU

    from model import own_graph, saved_graphs
    from model.gpt2 import opened

    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path))
    monkeypatch.delenv("GPT2_MAX_SAVED_GRAPHS", raising=False)
    compiled, found = [], SimpleNamespace(saved_graph=False, compile_seconds=88.6)

    def load_gpt2(checkpoint, options, **kwargs):
        compiled.append(options)
        return found

    monkeypatch.setattr(own_graph, "load_gpt2", load_gpt2)
    options = BuildOptions(device="cpu")
    name = saved_graphs.graph_name(options, opened("demo", options)[2])
    found.saved_graph = True  # another process saved it first: nothing compiled here, nothing to say
    assert own_graph.compile_own(json.dumps(asdict(options)), "demo") == 0
    assert compiled == [options] and not list(tmp_path.glob("graphs/*" + saved_graphs.NOTE))
    found.saved_graph = False
    assert own_graph.compile_own(json.dumps(asdict(options)), "demo") == 0
    assert sorted(p.name for p in (tmp_path / "graphs").iterdir() if not p.name.startswith(".")) == [
        name + saved_graphs.NOTE]
    # A saved graph where the child's load_gpt2 would have left it (the shipped one stands in for it).
    unpack(portable.shipped_facts("demo", X86), tmp_path / "graphs" / name)
    capsys.readouterr()
    saved_graphs.store_for(name, CPU())
    said = capsys.readouterr().err
    assert said == (f"using this CPU's own graph ({portable.cpu.native_path(portable.cpu.flags())} kernels), "
                    "compiled in the background by an earlier run in 89 s\n")
    saved_graphs.store_for(name, CPU())
    assert capsys.readouterr().err == ""


def test_other_mojo_kernels_make_the_shipped_graph_stale(tmp_path, monkeypatch, capsys):
    """The Mojo kernels are compiled into the shipped graph, while its traced body names only their ops:
    kernels other than the ones it was made with make the check fail and the app compile (saying why),
    whatever the trace."""
    only_where_a_level_ships()
    facts = portable.shipped_facts("demo")
    assert facts["made_from"]["kernels"] == portable.kernels_digest(), "made with other kernels: python -m " \
                                                                        "maintain make"
    for module in (portable, app_graphs):
        monkeypatch.setattr(module, "kernels_digest", lambda: "0" * 16)
    assert "the Mojo kernels" in app_graphs.stale("demo", portable.this_machines())
    why = unusable_here(facts)
    if why:
        pytest.skip(f"the shipped graph cannot run here: {why}")
    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path))  # nothing unpacked before
    monkeypatch.setattr(portable.saved_graphs, "sources_digest", lambda impl: "edited")

    def trace():
        raise AssertionError("traced, though the kernels alone refuse it")

    assert portable.shipped_name(BuildOptions(device="cpu"), demo_config(), trace, "demo") is None
    assert "Mojo kernels are not the ones it was compiled with" in capsys.readouterr().err
