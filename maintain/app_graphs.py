"""The app's shipped graphs: the demo's and GPT-2 124M's default build, for each shipped CPU level.

Made in a process of its own per model and level, from empty caches, in MAX's
virtual mode for the level (compiled, never initialised here: this machine
need not run the target's code); checked by tracing the graph this code
builds, as for the CPUs it is compiled for, against the shipped graph's digest.
Used by the app: model/graph_source.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from artifacts.facts import ROOT, max_version
from artifacts.mef import MANIFEST, the_mef
from artifacts.targets import SHIPPED, Target
from maintain import making
from maintain.targets import checkpoint
from model import caches, cpu, saved_graphs
from model.graph_source import KIND, MODELS, config_facts, graph_digest, kernels_digest, shipped_facts

NAMES = MODELS
LEVELS = tuple(SHIPPED)


def shipped_config(model: str):
    """The config of the model whose graph ``model`` names, as the app builds it (the course's solutions)."""
    from model.course import config_class
    from weights import open_checkpoint

    if model == "demo":
        return open_checkpoint(model).config_as(config_class("solutions"))
    return config_class("solutions").from_name(model)


def traced_digest(options, config) -> str:
    """``graph_digest`` of the graph this code builds for ``options`` (traced, not compiled), as
    for the CPUs a shipped graph is compiled for."""
    from model.gpt2 import traced_graph

    with cpu.as_shipped():
        return graph_digest(traced_graph(config, options))


def make(model: str, target: Target) -> int:
    """Compile ``model``'s graph for ``target`` in a child process with empty caches, and ship it."""
    source = str(checkpoint(model))  # (written here once: the child's caches are empty)
    with tempfile.TemporaryDirectory(prefix="gpt2-app-graph-") as empty:
        return subprocess.run([sys.executable, "-m", "maintain.app_graphs", model, target.name, source],
                              env=making.empty_caches_env(Path(empty)), cwd=ROOT).returncode


def make_here(model: str, target: Target, source: str) -> int:
    """``make``'s child: compile in this process (its caches empty) and ship."""
    from maintain.targets import enter_virtual_mode

    enter_virtual_mode(target)
    from model.course import config_class
    from model.gpt2 import load_gpt2
    from model.options import BuildOptions
    from weights import open_checkpoint

    options = BuildOptions(device="cpu", dtype="float32")
    config = open_checkpoint(source).config_as(config_class(options.impl))
    if config_facts(config) != config_facts(shipped_config(model)):
        raise SystemExit(f"{source} is not shaped as {model}")
    kernels = kernels_digest()  # read before the compile: the kernels it compiles are these
    gpt2 = load_gpt2(source, options, with_tokenizer=False)
    if kernels_digest() != kernels:
        raise SystemExit("the Mojo kernels changed while the graph compiled: make it again")
    [saved] = [p for p in caches.folder("graphs").iterdir() if p.is_dir() and saved_graphs.is_saved(p.name)]
    made_from = {"graph": traced_digest(options, config), "kernels": kernels, "config": config_facts(config),
                 "sources": saved_graphs.sources_digest(options.impl),
                 "build": json.loads((saved / saved_graphs.FACTS).read_text())}
    mef = the_mef(saved)
    kept = making.ship(KIND, model, target, made_from, [mef, saved / MANIFEST], making.pack_each,
                       f"python -m maintain make --kind {KIND} --name {model} --target {target.name}",
                       shaping=("graph", "kernels", "config", "build"))
    print(f"{KIND} {model} {target.name}: {mef.stat().st_size / 1e6:.2f} MB compiled in {gpt2.compile_seconds:.1f} s"
          + ("; the same graph as the one shipped, which is kept" if kept else ""))
    return 0


def stale(model: str, target: Target) -> str:
    """Why ``model``'s graph shipped for ``target`` is not what ``make`` would ship for this code ("" when it is)."""
    from model.options import BuildOptions

    facts = shipped_facts(model, target)
    if facts is None:
        return "none shipped"
    options = BuildOptions(device="cpu", dtype="float32")
    made_from = facts["made_from"]
    why = [what for what, ok in (("MAX's version", facts["max"] == max_version()),
                                 ("the Mojo kernels", made_from["kernels"] == kernels_digest()),
                                 ("the target", facts["target"] == target.cpu),
                                 ("the graph", made_from["graph"] == traced_digest(options, shipped_config(model))))
           if not ok]
    return f"stale ({', '.join(why)})" if why else ""


if __name__ == "__main__":  # make's child: python -m maintain.app_graphs MODEL LEVEL CHECKPOINT
    sys.exit(make_here(sys.argv[1], SHIPPED[sys.argv[2]], sys.argv[3]))
