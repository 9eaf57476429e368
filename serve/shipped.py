"""The server's compiled graphs shipped with the project: ``python -m serve`` starts in seconds.

The server's engine compiles two graphs as it starts: the model (serve/model.py's
``GPT2EngineModule``) and MAX's token sampler, ~4-5 min on 2 CPU cores with
empty caches. The project ships both, compiled for x86-64-v3, for the demo and
for GPT-2 124M's shape (any checkpoint of that shape; a graph holds no
weights), in shipped/server-graphs/<model>/x86-64-v3/ (made by ``python -m
maintain make``; their facts: artifacts/facts.py).

The engine's process asks ``prepare`` before it builds anything. The shipped
graphs are used when they can run here (artifacts/facts.py's ``why_not_here``:
MAX's version, Linux on x86-64, every feature of x86-64-v3) and the Mojo
kernels are the ones they were compiled with; a CPU with AVX-512 and VNNI
uses them too (docs/serving.md). They are unpacked into the project's cache
and handed to MAX's engine as its store of precompiled graphs
(``InferenceSession.default_mef_store``, the one hook MAX's pipeline offers:
artifacts/mef.py), whose key lets through exactly the graphs the server builds
with the same name, types and body: anything else is compiled as before, and
the server's log says which. ``GPT2_MAX_PORTABLE_GRAPH=0`` turns them off, as
for the app's shipped graphs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from artifacts import facts as artifact_facts
from artifacts import files
from artifacts.mef import entries
from artifacts.targets import SHIPPED, compile_for
from model import caches, cpu
from model.graph_source import USE, kernels_digest, opted_out

logger = logging.getLogger("max.pipelines")

KIND = "server-graphs"
TARGET = SHIPPED["x86-64-v3"]
MODELS = ("demo", "gpt2")
EXPORT = "GPT2_MAX_SERVE_EXPORT"  # the make's engine: the folder it writes every graph it compiles into


def shipped_facts(model: str) -> dict | None:
    """What ``model``'s shipped graphs were made from (None where there are none)."""
    return artifact_facts.read(artifact_facts.folder(KIND, model, TARGET.name))


def unusable(facts: dict, cpu_flags: frozenset[str] | None = None) -> str:
    """Why the graphs ``facts`` describe are not for this process, in words ("" when they are)."""
    why = opted_out() or artifact_facts.why_not_here(facts, cpu_flags)
    if why:
        return why
    if facts["made_from"]["kernels"] != kernels_digest():
        return "this code's Mojo kernels are not the ones they were compiled with"
    return ""


def prepare() -> str:
    """Called in the engine's process before the model is built: make MAX
    export every graph it compiles (the make's engine) or reuse the shipped
    ones that match. What it did, in a line for the server's log."""
    from max.engine import InferenceSession, MefStore

    if export := os.environ.get(EXPORT):
        compile_for(TARGET, compile_only=False)  # before any kernel is compiled; the engine runs what it compiles
        InferenceSession.default_mef_store = MefStore.for_export(export)
        return f"compiling for {TARGET.name}; every graph compiled is written to {export}"
    from serve.model_config import served_options

    if served_options().device != "cpu":
        return "the server's shipped compiled graphs are for the CPU"
    made = [(model, facts) for model in MODELS if (facts := shipped_facts(model)) is not None]
    if not made:
        return "no compiled graphs are shipped for the server"
    usable = [(model, facts) for model, facts in made if not unusable(facts)]
    if not usable:
        return f"not using the server's shipped compiled graphs: {unusable(made[0][1])}"
    folders = [unpacked(model, facts) for model, facts in usable]
    if None in folders:
        return "not using the server's shipped compiled graphs: they could not be unpacked"
    cpu.run_as_shipped()  # this engine's graphs built as they were for x86-64-v3, whatever this CPU's own paths
    try:
        InferenceSession.default_mef_store = MefStore.for_import(folders, key=matching_key(folders))
    except Exception as exc:  # a manifest MAX cannot read: the server compiles, as without them
        return f"not using the server's shipped compiled graphs: {type(exc).__name__}: {exc}"
    own = cpu.native_path(cpu.flags())
    also = (f" (this CPU's own kernel path is {own}, theirs {TARGET.path}: {USE}=0 compiles this CPU's "
            "own)") if own != TARGET.path else ""
    return (f"the server's shipped compiled graphs ({TARGET.name}: {TARGET.means}) are used for the graphs "
            f"this build makes exactly as they were made{also}")


def start_note(device: str) -> str:
    """What ``python -m serve`` says of the start's compile, on ``device``."""
    usable = device == "cpu" and [facts for model in MODELS
                                  if (facts := shipped_facts(model)) is not None and not unusable(facts)]
    if usable:
        return (f"the graphs shipped for {TARGET.name} serve {' and '.join(facts['name'] for facts in usable)} "
                "as built by default, nothing compiled; another build's first start compiles, minutes on a small CPU")
    return "the first start compiles the graph: minutes on a small CPU; later starts reuse it"


def matching_key(folders: list[Path]):
    """The store's key: a graph's artifact's name (MAX's default) when a
    shipped graph of that name, types and body is there, else None (compile
    it: MAX's store declines it)."""
    from model.max_internals import mef_store_fingerprint, mef_store_key

    bodies: dict[str, set[str]] = {}
    for where in folders:
        for entry in entries(where):
            bodies.setdefault(entry["key"], set()).add(entry["fingerprint"])

    def key(graph) -> str | None:
        name = mef_store_key(graph)
        if bodies.get(name) == {mef_store_fingerprint(graph)}:
            logger.info(f"{graph.name}: the shipped compiled graph")
            return name
        logger.info(f"{graph.name}: compiling it ({'another graph than' if name in bodies else 'not'} "
                    f"the shipped one)")
        return None

    return key


def unpacked(model: str, facts: dict) -> Path | None:
    """``model``'s shipped graphs unpacked into the project's cache folder, verified (once: the
    folder is named by what was shipped)."""
    digest = files.sha256(artifact_facts.folder(KIND, model, TARGET.name) / artifact_facts.FACTS)[:16]
    return files.unpack(artifact_facts.folder(KIND, model, TARGET.name), facts["files"],
                        caches.folder("shipped") / f"{KIND}-{model}-{TARGET.name}-{digest}")
