"""Where the app's compiled graph comes from: saved, shipped or compiled, decided here and only here.

``load_gpt2`` (model/gpt2.py) asks ``graph_to_load`` for the name of the saved
graph to load, before it builds anything; in this order:

1. the build's own saved graph (model/saved_graphs.py), when there is one;
2. a graph shipped with the project (``shipped_name``): the demo's and GPT-2
   124M's default build (float32 on the CPU, this project's Linear op),
   compiled for the CPU levels of artifacts/targets.py and shipped in
   shipped/app-graph/<model>/<level>/ (made by ``python -m maintain make``).
   It is used when the build is that one (the model's shape included: a
   graph holds no weights), and it can run here (artifacts/facts.py's
   ``why_not_here``: MAX's version, the system, every CPU feature of its
   level, read before anything is loaded: a graph with an instruction the CPU
   lacks dies with SIGILL). With the source files it was made from it is used
   as it is; with edited ones its Mojo kernels must be this code's, and the
   model is traced (seconds, nothing compiled) and the traced body compared.
   It is unpacked into the saved graphs, so later runs load it as any saved
   one; where the cache cannot take it, it is read from its compressed file;
3. for a learner's steps, the solutions' saved or shipped graph, when the
   steps trace exactly its graph (a finished course);
4. else the build's own name, said to be compiled (minutes, said first).

Where this CPU's own kernel path is not the shipped graph's (AVX-512 with
VNNI), its own graph is compiled in a niced background process, one at a
time (a file lock says which), and used from the next run;
``GPT2_MAX_BACKGROUND_COMPILE=0`` (or ``CI``) turns that off.
``GPT2_MAX_PORTABLE_GRAPH=0`` never uses a shipped graph.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, is_dataclass, replace
from pathlib import Path

from artifacts import facts as artifact_facts
from artifacts import files, mef
from artifacts.targets import SHIPPED, Target, this_machines
from model import caches, cpu, saved_graphs

ROOT = Path(__file__).resolve().parent.parent
KIND = "app-graph"
MODELS = ("demo", "gpt2")  # the demo's checkpoint (weights/demo); GPT-2 124M's shape, the app's default model
USE = "GPT2_MAX_PORTABLE_GRAPH"  # "0": never use the shipped graph
USING = "using the shipped compiled graph"  # how a line of the app's stderr starts when it does
BACKGROUND = "GPT2_MAX_BACKGROUND_COMPILE"  # "0": no background compile of this CPU's own graph
X86 = SHIPPED["x86-64-v3"]


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def graph_to_load(checkpoint, config, graph_config, options, opened, traced_graph) -> str:
    """The name of the saved graph to load for this build: its own, the one
    shipped with the project, or the solutions' for a finished course; when
    none is saved, its own, said to be compiled. ``opened`` and
    ``traced_graph``: model/gpt2.py's, handed in (the build imports this module)."""
    name = saved_graphs.graph_name(options, graph_config)
    if not saved_graphs.is_saved(name):
        name = shipped_name(options, graph_config, lambda: traced_graph(config, options), checkpoint.folder) or name
    if not saved_graphs.is_saved(name) and options.impl == "steps":
        name = solutions_graph(checkpoint, config, options, name, opened, traced_graph) or name
    if not saved_graphs.is_saved(name):  # minutes of silence look like a hang: say so before anything slow
        say(f"compiling the model graph ({compile_estimate(options)}) ...")
    return name


def compile_estimate(options) -> str:
    """How long the compile ``graph_to_load`` announces takes, in words: what it took on
    machines measured is in docs/benchmarks.md ("First runs from empty caches"), and a
    figure here would be a promise about one machine. A learner's edited step is a graph
    MAX's caches have never held: its compile is never seconds."""
    beside = "minutes, more on a small or busy machine"
    if options.impl == "steps":
        return f"your steps' graph, new after each edit of a step: {beside}; saved for later runs of the same steps"
    return f"seconds when MAX's caches are warm; the first time on a machine {beside}; saved for later runs"


def solutions_graph(checkpoint, config, options, name: str, opened, traced_graph) -> str | None:
    """The name of the solutions' saved (or shipped) graph of this build when
    the learner's steps trace exactly its graph (both traced: seconds), else
    None. A finished course then runs the graph compiled for the solutions
    instead of compiling the same graph again; the steps' own ``name`` is
    linked to it, so later runs load it without tracing."""
    solutions = replace(options, impl="solutions")
    _, solutions_config, graph_config = opened(checkpoint, solutions)
    found = saved_graphs.graph_name(solutions, graph_config)
    shipped = shipped_for(solutions, graph_config, this_machines() or X86)
    if not saved_graphs.is_saved(found) and shipped is None:
        return None
    if graph_digest(traced_graph(config, options)) != graph_digest(traced_graph(solutions_config, solutions)):
        return None
    if not saved_graphs.is_saved(found):  # the shipped graph, unpacked where it can run (else a line says why)
        # (traced anew when asked: a traced graph's printed body, which the digest reads, differs at each print)
        found = shipped_name(solutions, graph_config, lambda: traced_graph(solutions_config, solutions),
                             checkpoint.folder)
        if found is None:
            return None
    saved_graphs.alias(name, found)
    say("your steps build the solutions' graph exactly: its saved compiled graph is used")
    return found


def shipped_facts(model: str, target: Target | None = None) -> dict | None:
    """The facts of ``model``'s graph shipped for ``target`` (default: this machine's); None when there is none."""
    target = target or this_machines()
    return artifact_facts.read(artifact_facts.folder(KIND, model, target.name)) if target else None


def shipped_for(options, config, target: Target) -> dict | None:
    """The facts of the graph shipped for ``target`` that ``options`` and ``config`` build, if one is."""
    for model in MODELS:
        facts = shipped_facts(model, target)
        if facts is not None and is_the_shipped_build(facts, options, config):
            return facts
    return None


def config_facts(config) -> dict:
    """A model config as the shipped facts record it."""
    return json.loads(json.dumps(asdict(config) if is_dataclass(config) else vars(config), default=str))


def is_the_shipped_build(facts: dict, options, config) -> bool:
    """Whether ``options`` and ``config`` build the graph ``facts`` describe:
    the default build on the CPU, of a model of its shape."""
    from model.options import BuildOptions

    if options.impl != "solutions" or config_facts(config) != facts["made_from"]["config"]:
        return False
    placement, default = options.placement, BuildOptions(device="cpu", dtype="float32")
    return ((placement.kind, placement.dtype) == ("cpu", "float32")
            and options.graph_facts() == default.graph_facts())


def opted_out() -> str:
    """The setting that turns the shipped graphs off here, in words ("" when none does)."""
    if os.environ.get(USE, "1") == "0":
        return f"{USE}=0"
    if not caches.enabled():
        return f"{caches.SAVED_GRAPHS}=0"
    if os.environ.get(cpu.ENV, "auto") != "auto":
        return f"{cpu.ENV} is set"
    return ""


def none_shipped_here(none: str = "none is shipped") -> str:
    """Why nothing shipped is for this machine, in words starting with ``none`` ("" when a level is)."""
    if this_machines():
        return ""
    return f"{none} for {platform.system()} on {platform.machine()} (Linux on {' or '.join(SHIPPED)} only)"


def shipped_name(options, config, trace, checkpoint: str | Path) -> str | None:
    """The saved graph's name to load for this build: a shipped graph's,
    unpacked into the saved graphs if it was not already, when one applies
    and matches this code; None to compile (said in one line when a shipped
    graph was for this build but could not be used). ``trace()``: the build's
    graph, traced, asked for only when the source files are not the ones it
    was made from. ``checkpoint``: for the background compile of this CPU's own graph."""
    target = this_machines()
    facts = shipped_for(options, config, target or X86)  # (any target's facts say whether the build is shipped)
    if facts is None or cpu.virtual_target():
        return None  # (a process compiling for another CPU, as the targets check and make do, compiles)
    why = opted_out() or (artifact_facts.why_not_here(facts) if target else none_shipped_here())
    if why:
        say(f"not {USING}: {why}")
        return None
    made_from = facts["made_from"]
    shipped = f"shipped {facts['level']} {made_from['graph']} {made_from['kernels']}"
    name = saved_graphs.graph_name(options, config, cpu_description=shipped)
    if not saved_graphs.is_saved(name):
        changed = "" if made_from["sources"] == saved_graphs.sources_digest(options.impl) else not_this_codes(facts,
                                                                                                               trace)
        if changed:
            say(f"not {USING}: {changed} (python -m maintain make writes a new one)")
            return None
        where = artifact_facts.folder(KIND, facts["name"], target.name)
        files.unpack(where, facts["files"], caches.folder("graphs") / name,
                     {saved_graphs.FACTS: json.dumps(made_from["build"])})
        if not saved_graphs.is_saved(name):  # the cache cannot take it: used from the shipped file
            import lzma

            [graph] = [f for f in facts["files"] if f["name"] != mef.MANIFEST]
            saved_graphs.hold(name, made_from["build"], lambda: lzma.open(where / graph["packed"]))
    say(f"{USING} ({target.name}: {target.means})")
    if cpu.native_path(cpu.flags()) != target.path:
        compile_own_in_background(options, checkpoint)
    return name


def not_this_codes(facts: dict, trace) -> str:
    """Why the shipped graph is not what this code builds, in words ("" when it is): other Mojo
    kernels, or another graph traced (``trace()``, asked for only when the kernels are the same)."""
    if facts["made_from"]["kernels"] != kernels_digest():
        return "this code's Mojo kernels are not the ones it was compiled with"
    with cpu.as_shipped():  # traced as for the CPUs it was compiled for, not this one's own paths
        traced = trace()
    if facts["made_from"]["graph"] != graph_digest(traced):
        return "this code traces another graph"
    return ""


def kernels_digest() -> str:
    """A digest of this project's Mojo kernels (model/kernels): compiled into
    the graph's code, while its traced body names only their ops."""
    return files.files_digest(sorted((ROOT / "model" / "kernels").rglob("*.mojo")), ROOT)[:16]


def graph_digest(graph) -> str:
    """A digest of what a traced graph computes: its printed body, less the
    kernel library's path (a folder of this machine's cache). Taken once per
    traced graph: MAX 26.7 prints the same graph otherwise the second time."""
    body = re.sub(r"_kernel_library_paths = \[[^\]]*\]", "_kernel_library_paths = []", repr(graph))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


OWN_LOCK = ".compiling-own-graph.lock"  # held by the background compile while it runs


def compile_own_in_background(options, checkpoint: str | Path) -> None:
    """Compile this CPU's own graph of the build of ``checkpoint`` in a niced
    process of its own (one at a time: it holds a file lock), saved for the next run."""
    from filelock import FileLock, Timeout

    if os.environ.get(BACKGROUND, "1") == "0" or os.environ.get("CI"):
        return
    graphs = caches.folder("graphs")
    log = graphs / "own-graph-compile.log"
    env = dict(os.environ, **{USE: "0", BACKGROUND: "0"})
    try:
        graphs.mkdir(parents=True, exist_ok=True)
        with FileLock(graphs / OWN_LOCK, timeout=0):  # taken at once, or one is running
            pass
        with open(log, "w") as out:
            subprocess.Popen([sys.executable, "-m", "model.own_graph", json.dumps(asdict(options)), str(checkpoint)],
                             cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=lambda: os.nice(19))
    except Timeout:
        return
    except OSError:  # the cache cannot be written: the graph it would compile could not be saved either
        return
    say(f"compiling this CPU's own graph ({cpu.native_path(cpu.flags())} kernels) in the background for the "
        f"next run ({BACKGROUND}=0 turns this off; log: {log})")
