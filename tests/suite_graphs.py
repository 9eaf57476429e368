"""The model graphs the suite's files load, compiled a group at a time before
their tests run.

Most of a graph's compile is paid once per compile, whatever it holds (one
matmul's graph costs most of what a tiny model's does): compiled one by one,
the graphs below were most of a cold run. Each group's graphs are compiled
by MAX as one unit (model/together.py) and saved as one bundle
(model/saved_graphs.py), where every ``load_gpt2`` of them finds its graph,
in the test's process or a child's; a graph that is not a model's (``Made``)
is found there by what it computes. A graph listed in several groups is
compiled in the first one's unit. A file's first test waits for the units
holding its graphs, its own group's first; the worker that gets to a unit
first compiles it, holding a lock the other waits on. A run of a few files
compiles only their graphs. With
saved graphs off (``GPT2_MAX_SAVED_GRAPHS=0``) nothing is compiled here and
each test compiles what it loads, as a user's run would.

A build listed here that a test no longer loads costs a little of its
group's compile and nothing else; a graph a test loads that is not listed is
compiled by that test alone. ``python -m bench.compiles --report`` lists the
compiles of a run by test.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib
import json
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from checkpoints import STEP_07_EDITS, TINY, edited_learner_tree, reference

from model import caches, cpu
from weights.synthetic import write_checkpoint


@dataclass(frozen=True)
class Build:
    """One ``load_gpt2(checkpoint, device="cpu", **options)``, under
    ``$GPT2_MAX_KERNEL_PATH=kernel_path`` and with the CPU's head widened to
    a multiple of ``vocab_multiple`` (model/gpt2.py's VOCAB_MULTIPLE) when
    those are given, as the test that loads it sets them; with ``step_07_edit``
    (a key of tests/checkpoints.py's STEP_07_EDITS), the learner's finished
    steps with that edit of step 07 are the ``steps`` it imports (impl steps)."""

    checkpoint: str  # a reference checkpoint's name (tests/checkpoints.py), "demo" or "tiny"
    options: tuple = ()  # (field, value) pairs of BuildOptions
    kernel_path: str | None = None
    vocab_multiple: int | None = None
    step_07_edit: str | None = None


@dataclass(frozen=True)
class Made:
    """A graph that is not a model's: the model/together.py Other that
    ``maker`` (``module.function``, a module of the tests' folder) returns
    first, found again by what it computes."""

    maker: str


@cache
def made(maker: str):
    """``maker``'s Other, made once in this process (its name is traced once)."""
    module, function = maker.rsplit(".", 1)
    return getattr(importlib.import_module(module), function)()[0]


def other_path() -> str | None:
    """A kernel path this CPU runs besides its own (test_quantize's demo on two paths), if any."""
    return next((p for p in ("avx2", "portable") if p != cpu.native_path() and not cpu.missing(p)), None)


def demo(dtype: str, path: str | None = None) -> Build:
    return Build("demo", (("dtype", dtype),), path)


TRAINED = [Build("trained-bytes", (("dtype", dtype),)) for dtype in ("q4_0", "q4_0m", "q6_k", "float32")]

# What each file loads, by group: one unit per group. Not here: the app tests' tiny checkpoint's
# float32 graph (checkpoints.TINY), which the saved-graph tests (each with a project cache of its
# own) compile again: they find it in MAX's cache only when a test compiled it alone.
# test_saved_graphs.py's quantized graph is copied into its own project cache from the suite's
# (``saved_in``). A learner's finished course (--impl steps: test_app.py, test_attention_map.py)
# finds the solutions' saved graph of its build by tracing both (model/graph_source.py's solutions_graph).
# An entry ``file::test`` is one test's: that test waits for its unit (tests/conftest.py's
# ``suite_graphs_of_this_test`` fixture), not the file's first. test_app.py's learner with an edited
# step 07 runs its own graph: it joins the quantize unit, which starts beside the models unit at the
# run's start (conftest.py's SLOWEST_FIRST), so on two workers the test finds it done.
Q8_0_TRAINED = Build("trained-bytes", (("dtype", "q8_0"),))
FLOAT32 = Build("tiny-2l-4h")
# Not a model's graph: test_fast_linear.py's layers on every kernel path and encoding, MAX's Q4_0 repacking.
LAYERS = Made("test_fast_linear.every_path_graph")
GROUPS = {
    "quantize": {
        "test_quantize.py": [*TRAINED, demo("q8_0"), demo("q8_0", "other"), demo("q4_0"), demo("q4_0", "other")],
        "test_app.py::test_the_learner_s_step_07_is_the_attention_the_app_runs": [
            Build("tiny", (("impl", "steps"),), step_07_edit="forward-without-c_proj")],
    },
    "models": {
        "test_fast_linear.py": [FLOAT32, Build("tiny-2l-4h", (("linear", "course"),)), Q8_0_TRAINED, demo("q8_0"),
                                Build("tiny-2l-4h", (("dtype", "q8_0"),)), Build("tiny-3l-3h", (("dtype", "q8_0"),)),
                                LAYERS],
        "test_kv_cache.py": [FLOAT32, Build("tiny-2l-4h", (("cache", "concat"),)),
                             Build("tiny-2l-4h", (("cache", "static"),))],
        "test_model.py": [FLOAT32, Build("tiny-3l-3h"), Build("tiny", vocab_multiple=64)],
        "test_generate.py": [Build("padded-vocab")],
        "test_engine_threads.py": [FLOAT32],
        "test_saved_graphs.py": [Q8_0_TRAINED],
        "test_attention_map.py": [Build("tiny", (("attention_layer", 1),))],
    },
}


@cache
def checkpoint_folder(name: str) -> Path:
    """Where ``name``'s checkpoint is: only its config shapes the graph."""
    if name == "demo":
        from weights import resolve_model

        return resolve_model("demo")
    if name == "tiny":  # checkpoints.TINY, as test_model.py writes it
        return write_checkpoint(scratch() / "tiny", TINY)
    return reference(name)[0]


@cache
def scratch() -> Path:
    """This process's folder for the checkpoints and learner trees below, removed when it exits."""
    folder = Path(tempfile.mkdtemp(prefix="suite-graphs-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@cache
def edited_steps(edit: str) -> Path:
    """The folder holding a finished learner's ``steps`` package with ``edit`` made, as the test makes it."""
    return edited_learner_tree(scratch() / edit, STEP_07_EDITS[edit])[0]


@contextmanager
def learner_steps(folder: Path):
    """``import steps`` reads ``folder``'s package, not the repository's, until the block ends. The
    builds made in it keep the classes they were made from, and are traced after it (model/together.py):
    right while the course's files import each other at their top only, as they do (an import inside
    a function would read the repository's steps then)."""
    def ours() -> dict:
        return {name: module for name, module in sys.modules.items() if name == "steps" or name.startswith("steps.")}

    before = ours()
    for name in before:
        del sys.modules[name]
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        for name in ours():
            del sys.modules[name]
        sys.modules.update(before)


@contextmanager
def as_loaded(build: Build):
    """``build``'s kernel path, head's width and learner's steps set, as the test sets them."""
    import model.gpt2

    with pytest.MonkeyPatch.context() as patch:
        if build.kernel_path is not None:
            patch.setenv(cpu.ENV, other_path() if build.kernel_path == "other" else build.kernel_path)
        if build.vocab_multiple is not None:
            patch.setitem(model.gpt2.VOCAB_MULTIPLE, "cpu", build.vocab_multiple)
        if build.step_07_edit is None:
            yield
        else:
            with learner_steps(edited_steps(build.step_07_edit)):
                yield


def graph_name(build: Build | Made) -> str:
    """The name ``load_gpt2`` gives ``build``'s graph (model/saved_graphs.py), or a Made one's."""
    from model import saved_graphs
    from model.gpt2 import opened
    from model.options import BuildOptions

    if isinstance(build, Made):
        return made(build.maker).name
    options = BuildOptions(device="cpu", **dict(build.options))
    with as_loaded(build):
        _, _, graph_config = opened(checkpoint_folder(build.checkpoint), options)
        return saved_graphs.graph_name(options, graph_config)


def units(collected: set[str]) -> dict[str, list[Build | Made]]:
    """Each group's unit in a run of the ``collected`` files: the builds its
    files there load, each build in the first group that lists it (two units
    compiling side by side never both compile one graph)."""
    out, taken = {}, set()
    for name, group in GROUPS.items():
        builds = [build for loader, listed in group.items() if loader.split("::")[0] in collected for build in listed
                  if not (isinstance(build, Build) and build.kernel_path == "other" and other_path() is None)]
        out[name] = [build for build in dict.fromkeys(builds) if build not in taken]
        taken |= set(out[name])
    return out


def compile_for(loader: str, collected: set[str]) -> None:
    """Compile, as one unit each, the units holding the graphs ``loader`` (a
    file, or ``file::test``) loads, its own group's first, that are not saved
    yet; wait while another worker does. One unit's lock at a time."""
    from model import saved_graphs

    loads = {build for group in GROUPS.values() for build in group.get(loader, [])}
    if not loads or not caches.enabled():
        return
    every = units(collected)
    holding = [name for name in GROUPS if loads & set(every[name])]
    folder = caches.folder("graphs")
    folder.mkdir(parents=True, exist_ok=True)
    for name in sorted(holding, key=lambda name: loader not in GROUPS[name]):  # its own group's unit first
        with open(folder / f"suite-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            missing = [build for build in every[name] if not saved_graphs.is_saved(graph_name(build))]
            if missing:
                compile_together(missing)


def saved_in(build: Build | Made, project_cache: Path, suite_graphs: Path) -> None:
    """``build``'s graph, saved in the suite's ``suite_graphs`` folder (by its group's unit, or
    alone), saved in ``project_cache`` too (a test's own): its folder copied, a bundle linked."""
    from model import saved_graphs

    name = graph_name(build)
    facts = json.loads((suite_graphs / name / saved_graphs.FACTS).read_text())
    graphs = project_cache / "graphs"
    graphs.mkdir(parents=True, exist_ok=True)
    shutil.copytree(suite_graphs / name, graphs / name)
    if "bundle" in facts:
        bundle = facts["bundle"]["name"]
        (graphs / bundle).symlink_to(suite_graphs / bundle, target_is_directory=True)


def compile_together(builds: list[Build | Made]) -> None:
    from model.together import compile_together, prepare

    prepared = []
    for build in (build for build in builds if isinstance(build, Build)):
        with as_loaded(build):
            prepared.append(prepare(checkpoint_folder(build.checkpoint), device="cpu", with_tokenizer=False,
                                    **dict(build.options)))
    print(f"the suite's graphs: {len(builds)} compiled as one unit", file=sys.stderr, flush=True)
    compile_together(prepared, [made(build.maker) for build in builds if isinstance(build, Made)])
