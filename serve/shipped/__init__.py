"""The server's compiled graphs shipped with the project: ``python -m serve`` starts in seconds.

    python -m serve.shipped make     # serve each model once from empty caches, compiled for x86-64-v3; write them
    python -m serve.shipped check    # do the shipped graphs still match what this code builds?

The server's engine compiles two graphs as it starts: the model (serve/model.py's
``GPT2EngineModule``) and MAX's token sampler, ~4-5 min on 2 CPU cores with
empty caches. The project ships both, compiled for x86-64-v3 (AVX2 and FMA:
Intel since Haswell, AMD since Excavator and every Zen), for the demo and for
GPT-2 124M's shape (``--model gpt2``: any checkpoint of that shape; a graph
holds no weights), in weights/graphs/serve/<model>/x86-64-v3/: each graph xz
compressed, MAX's manifest (what ``MefStore`` wrote as the engine compiled
them: each graph's name, input and output types, and a digest of its body)
and ``facts.json`` (MAX's version, the target, the Mojo kernels' digest).

The engine's process asks ``prepare`` before it builds anything. The shipped
graphs are used when MAX's version is the one they were made with, the system
is Linux on x86-64, this CPU has every feature of x86-64-v3 (read from
/proc/cpuinfo before anything is loaded), and the Mojo kernels are the ones
they were compiled with. A CPU with AVX-512 and VNNI uses them too: its own
graphs, on the avx512-vnni path, served 2-7% more tokens a second on the one
measured (docs/serving.md), against minutes of compiling at the first start;
``GPT2_MAX_PORTABLE_GRAPH=0`` compiles them. They are unpacked into
the project's cache folder and handed to MAX's engine as a store of
precompiled graphs (``InferenceSession.default_mef_store``), whose key lets
through exactly the graphs the server builds with the same name, types and
body: anything else the engine compiles (another model's shape, ``--linear
course``, a learner's edited step) is compiled as before, and the server's
log says which. ``GPT2_MAX_PORTABLE_GRAPH=0`` turns them off, as for
the app's shipped graphs (model/portable/).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from model import caches, cpu, portable, saved_graphs

logger = logging.getLogger("max.pipelines")

TARGET = portable.X86
MODELS = ("demo", "gpt2")
ROOT = portable.ROOT
SHIPPED = portable.SHIPPED / "serve"  # a folder per model, a folder per target in each
EXPORT = "GPT2_MAX_SERVE_EXPORT"  # the make's engine: the folder it writes every graph it compiles into
FACTS = saved_graphs.FACTS  # what they were made from
MANIFEST = saved_graphs.MANIFEST  # MAX's MefStore's: each graph's name, types and body digest


def folder(model: str) -> Path:
    """Where ``model``'s graphs are shipped."""
    return SHIPPED / model / TARGET.level


def shipped_facts(model: str) -> dict | None:
    """What ``model``'s shipped graphs were made from (None where there are none)."""
    try:
        return json.loads((folder(model) / FACTS).read_text())
    except (OSError, ValueError):
        return None


def unusable(facts: dict, cpu_flags: frozenset[str] | None = None) -> str:
    """Why the graphs ``facts`` describe are not for this process, in words ("" when they are)."""
    why = portable.opted_out() or portable.cannot_run(facts["max"], cpu_flags, TARGET)
    if why:
        return why
    if facts.get("kernels") != portable.kernels_digest():
        return "this code's Mojo kernels are not the ones they were compiled with"
    return ""


def prepare() -> str:
    """Called in the engine's process before the model is built: make MAX
    export every graph it compiles (the make's engine) or reuse the shipped
    ones that match. What it did, in a line for the server's log."""
    from max.engine import InferenceSession, MefStore

    if export := os.environ.get(EXPORT):
        from max import driver

        driver.set_virtual_cpu_target(TARGET.descriptor)  # before any kernel is compiled in this process
        InferenceSession.default_mef_store = MefStore.for_export(export)
        return f"compiling for {TARGET.level}; every graph compiled is written to {export}"
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
        return f"not using the server's shipped compiled graphs: they could not be unpacked from {SHIPPED}"
    cpu.run_as_shipped()  # this engine's graphs built as they were for x86-64-v3, whatever this CPU's own paths
    try:
        InferenceSession.default_mef_store = MefStore.for_import(folders, key=matching_key(folders))
    except Exception as exc:  # a manifest MAX cannot read: the server compiles, as without them
        return f"not using the server's shipped compiled graphs: {type(exc).__name__}: {exc}"
    own = cpu.native_path(cpu.flags())
    also = (f" (this CPU's own kernel path is {own}, theirs {TARGET.path}: {portable.USE}=0 compiles this CPU's "
            "own)") if own != TARGET.path else ""
    return (f"the server's shipped compiled graphs ({TARGET.level}: {TARGET.runs_on}) are used for the graphs "
            f"this build makes exactly as they were made{also}")


def start_note(device: str) -> str:
    """What ``python -m serve`` says of the start's compile, on ``device``."""
    usable = device == "cpu" and [facts for model in MODELS
                                  if (facts := shipped_facts(model)) is not None and not unusable(facts)]
    if usable:
        return (f"the graphs shipped for {TARGET.level} serve {' and '.join(facts['model'] for facts in usable)} "
                "as built by default, nothing compiled; another build's first start compiles, minutes on a small CPU")
    return "the first start compiles the graph: minutes on a small CPU; later starts reuse it"


def matching_key(folders: list[Path]):
    """The store's key: a graph's artifact's name (MAX's default) when a
    shipped graph of that name, types and body is there, else None (compile
    it: MAX's store declines it)."""
    from model.max_internals import mef_store_fingerprint, mef_store_key

    bodies: dict[str, set[str]] = {}
    for where in folders:
        for entry in json.loads((where / MANIFEST).read_text())["graphs"]:
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
    """``model``'s shipped graphs unpacked into the project's cache folder
    (once: the folder is named by what was shipped), whole or not at all."""
    digest = hashlib.sha256((folder(model) / FACTS).read_bytes()).hexdigest()[:16]
    target = caches.folder("graphs") / f"serve-{model}-{TARGET.level}-{digest}"
    if whole(target, facts):
        return target
    shutil.rmtree(target, ignore_errors=True)  # a damaged one (a file removed or cut short)
    portable.unpack_into(target, {key: folder(model) / file for key, file in facts["files"].items()},
                         folder(model) / MANIFEST)
    return target if whole(target, facts) else None


def whole(unpacked_folder: Path, facts: dict) -> bool:
    """Whether ``unpacked_folder`` holds MAX's manifest and every graph ``facts`` name, each of its size."""
    try:
        return (unpacked_folder / MANIFEST).is_file() and all(
            (unpacked_folder / key).stat().st_size == size for key, size in facts["mef_bytes"].items())
    except OSError:
        return False
