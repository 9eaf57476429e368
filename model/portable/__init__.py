"""Compiled graphs shipped with the project: the first run on a new machine in seconds.

    python -m model.portable make     # compile them for each target from a clean cache, write weights/graphs/
    python -m model.portable check    # do the shipped graphs still match what this code traces, and its kernels?

(Those commands: model/portable/__main__.py. This file is what the build asks.)

A graph compiled by MAX holds native code for the CPU it was compiled for.
Compiled for a named CPU level it runs on any CPU with that level's features.
The project ships the graphs of two models at their default build (float32
on the CPU, this project's Linear op): the demo's (weights/demo) and GPT-2
124M's (``--model gpt2``: any checkpoint of its shape, since a graph holds
no weights). Each is compiled for two such levels, compressed (xz) in
weights/graphs/<model>/<level>/ with what it was made from (``facts.json``):
MAX's version, the target, a digest of the traced graph's body, a digest of
the Mojo kernels compiled into it, and a digest of the source files.

- x86-64-v3 (AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE: Intel since Haswell, AMD
  since Excavator and every Zen): the kernels take their avx2 path there.
- Neoverse N1 (Armv8.2 with dot product and half precision: AWS Graviton2
  and later, Ampere Altra): Linux on Arm, the kernels' portable path. It is
  compiled on an x86-64 machine (MAX compiles for a CPU it does not run on).

``load_gpt2`` asks ``saved_name`` before compiling. A shipped graph for this
machine's architecture is used when the build is that one (the model's shape
included), MAX's version is the one it was made with, the system is Linux
and this CPU has every feature of the target (read from /proc/cpuinfo before
anything is loaded: a graph with instructions the CPU lacks would die with
SIGILL). When the source files are the ones it was made from, it is used as
it is; when they differ, the Mojo kernels must be the ones it was compiled
with, and the model is traced (a few seconds, nothing compiled) and the
graph's body compared. Otherwise the app compiles as before, and says why. A
used graph is unpacked into the saved graphs (model/saved_graphs.py), so
later starts load it as they load any saved one; where the cache cannot take
it (read-only, full), it is read from its compressed file every run.

Where this CPU's own kernel path is not the target's (AVX-512 with VNNI), its
own graph is compiled in the background (niced, one at a time), and used from
the next run on; ``GPT2_MAX_BACKGROUND_COMPILE=0`` turns that off (so does
``CI``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import lzma
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

from model import caches, cpu, saved_graphs

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "weights" / "graphs"  # a folder per model, a folder per target in each; the licence's notice here
MODELS = ("demo", "gpt2")  # the demo's checkpoint (weights/demo); GPT-2 124M's shape, the app's default model


@dataclass(frozen=True)
class Target:
    """A CPU level a graph is shipped for."""

    level: str  # its name, and its folder's
    descriptor: str  # MAX's virtual CPU target (model/targets.py compiles the same)
    machine: str  # platform.machine() of the CPUs it runs on (Linux)
    features: tuple[str, ...]  # every one must be in /proc/cpuinfo's flags (x86) or Features (Arm)
    path: str  # the kernel path isa.mojo's auto takes for it (model/cpu.py)
    runs_on: str  # in words

    def folder(self, model: str) -> Path:
        """Where ``model``'s graph for this level is shipped."""
        return SHIPPED / model / self.level


# x86-64-v3 as LLVM defines the level, as /proc/cpuinfo names the features (abm: LZCNT).
X86 = Target("x86-64-v3", "triple=x86_64-unknown-linux-gnu;cpu=x86-64-v3", "x86_64",
             ("sse4_2", "popcnt", "ssse3", "cx16", "lahf_lm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm",
              "movbe", "xsave"), "avx2", "any CPU with AVX2 and FMA")
# Neoverse N1's Armv8.2 extensions as Linux names them (its crypto included: LLVM's neoverse-n1 has it).
ARM = Target("neoverse-n1", "triple=aarch64-unknown-linux-gnu;cpu=neoverse-n1", "aarch64",
             ("fp", "asimd", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp", "asimdhp", "asimdrdm",
              "lrcpc", "dcpop", "asimddp"), "portable", "Arm CPUs from Neoverse N1 on: Graviton2 and later, Altra")
TARGETS = {target.level: target for target in (X86, ARM)}
USE = "GPT2_MAX_PORTABLE_GRAPH"  # "0": never use the shipped graph
USING = "using the shipped compiled graph"  # how a line of the app's stderr starts when it does
BACKGROUND = "GPT2_MAX_BACKGROUND_COMPILE"  # "0": no background compile of this CPU's own graph


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def host_machine() -> str:
    """This machine's architecture as the targets name theirs."""
    return "x86_64" if cpu.is_x86() else platform.machine().lower()


def this_machines() -> Target | None:
    """The target shipped for this machine (Linux on its architecture); None where none is."""
    if platform.system() != "Linux":
        return None
    return next((target for target in TARGETS.values() if target.machine == host_machine()), None)


def shipped_facts(model: str, target: Target | None = None) -> dict | None:
    """What ``model``'s graph shipped for ``target`` (default: this machine's) was made from (None when there
    is none)."""
    target = target or this_machines()
    try:
        return json.loads((target.folder(model) / "facts.json").read_text()) if target else None
    except (OSError, ValueError):
        return None


def shipped_config(model: str):
    """The config of the model whose graph ``model`` names, as the app builds it (the course's solutions)."""
    from model.course import config_class

    if model == "demo":
        from weights import open_checkpoint

        return open_checkpoint(model).config_as(config_class("solutions"))
    return config_class("solutions").from_name(model)


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
    the default build on the CPU, of a model of its shape (any checkpoint of
    that shape: the graph holds no weights)."""
    from model.options import BuildOptions

    if options.impl != "solutions" or config_facts(config) != facts["config"]:
        return False
    placement, default = options.placement, BuildOptions(device="cpu", dtype="float32")
    return ((placement.kind, placement.dtype) == ("cpu", "float32")
            and options.graph_facts() == default.graph_facts())


def opted_out() -> str:
    """The setting that turns the shipped graph off here, in words ("" when none does)."""
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
    return f"{none} for {platform.system()} on {platform.machine()} (Linux on {' or '.join(TARGETS)} only)"


def unusable_here(facts: dict, cpu_flags: frozenset[str] | None = None) -> str:
    """Why the shipped graph ``facts`` describe cannot run here, in words ("" when it can)."""
    return opted_out() or cannot_run(facts["max"], cpu_flags, TARGETS[facts["level"]])


def cannot_run(made_with: str, cpu_flags: frozenset[str] | None = None, target: Target = X86) -> str:
    """Why code that MAX ``made_with`` compiled for ``target`` cannot run in
    this process (a shipped graph, the checker's shipped kernels), in words;
    "" when it can. The CPU's features come from /proc/cpuinfo (or ``cpu_flags``)."""
    version = max_version()
    if made_with != version:
        return f"made with MAX {made_with}, this is MAX {version}"
    if platform.system() != "Linux" or host_machine() != target.machine:
        return f"Linux {target.machine} code, this is {platform.system()} on {platform.machine()}"
    cpu_flags = cpu.flags() if cpu_flags is None else cpu_flags
    if not cpu_flags:
        return "this CPU's features could not be read from /proc/cpuinfo"
    lacking = [flag for flag in target.features if flag not in cpu_flags]
    if lacking:
        return f"this CPU lacks {', '.join(lacking)} ({target.level} needs them)"
    return ""


def saved_name(options, config, trace, checkpoint: str | Path) -> str | None:
    """The saved graph's name to load for this build: a shipped graph's,
    unpacked into the saved graphs if it was not already, when one applies
    and matches this code; None to compile as before (said in one line
    when a shipped graph was for this build but could not be used).
    ``trace()``: the build's graph, traced (model/gpt2.py's traced_graph),
    asked for only when the source files are not the ones it was made from.
    ``checkpoint``: the model's folder, for the background compile of this CPU's own graph."""
    target = this_machines()
    facts = shipped_for(options, config, target or X86)  # (any target's facts say whether the build is shipped)
    if facts is None or cpu.virtual_target():
        return None  # (a process compiling for another CPU, as the targets check and make do, compiles)
    why = unusable_here(facts) if target else opted_out() or none_shipped_here()
    if why:
        say(f"not {USING}: {why}")
        return None
    shipped = f"shipped {facts['level']} {facts['graph']} {facts.get('kernels')}"
    name = saved_graphs.graph_name(options, config, cpu_description=shipped)
    if not saved_graphs.is_saved(name):
        changed = "" if facts["sources"] == saved_graphs.sources_digest(options.impl) else not_this_codes(facts, trace)
        if changed:
            say(f"not {USING}: {changed} (python -m model.portable make writes a new one)")
            return None
        unpack(target, facts, caches.folder("graphs") / name)
        if not saved_graphs.is_saved(name):  # the cache cannot take it: used from the shipped file
            shipped_file = target.folder(facts["model"]) / facts["file"]
            saved_graphs.hold(name, facts["build"], lambda: lzma.open(shipped_file))
    say(f"{USING} ({target.level}: {target.runs_on})")
    if cpu.native_path(cpu.flags()) != target.path:
        compile_own_in_background(options, checkpoint)
    return name


def not_this_codes(facts: dict, trace) -> str:
    """Why the shipped graph is not what this code builds, in words ("" when it is): other Mojo
    kernels, or another graph traced (``trace()``, asked for only when the kernels are the same)."""
    if facts.get("kernels") != kernels_digest():
        return "this code's Mojo kernels are not the ones it was compiled with"
    with cpu.as_shipped():  # traced as for the CPUs it was compiled for, not this one's own paths
        traced = trace()
    if facts["graph"] != graph_digest(traced):
        return "this code traces another graph"
    return ""


def kernels_digest() -> str:
    """A digest of this project's Mojo kernels (model/kernels): compiled into
    the graph's code, while its traced body names only their ops."""
    return saved_graphs.files_digest(sorted((ROOT / "model" / "kernels").rglob("*.mojo")))[:16]


def graph_digest(graph) -> str:
    """A digest of what a traced graph computes: its printed body, less the
    kernel library's path (a folder of this machine's cache). Taken once per
    traced graph: MAX 26.7 prints the same graph otherwise the second time."""
    body = re.sub(r"_kernel_library_paths = \[[^\]]*\]", "_kernel_library_paths = []", repr(graph))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def max_version() -> str:
    """The installed MAX's version: a compiled graph runs only under the MAX that made it."""
    return importlib.metadata.version("max")


def unpack(target: Target, facts: dict, folder: Path) -> None:
    """The graph ``facts`` describe, shipped for ``target``, into ``folder``
    as a saved graph (MEF, MAX's manifest, the build's facts), whole or not at all."""
    shipped = target.folder(facts["model"])
    unpack_into(folder, {facts["mef"]: shipped / facts["file"]}, shipped / saved_graphs.MANIFEST,
                {saved_graphs.FACTS: json.dumps(facts["build"])})


def unpack_into(folder: Path, packed: dict[str, Path], manifest: Path, texts: dict[str, str] | None = None) -> None:
    """``folder`` made whole or not at all (model/caches.py's ``writing``):
    each xz file of ``packed`` unpacked under its name, MAX's ``manifest``
    copied and ``texts`` written. Another process that unpacked it first, a
    full disk or a bad file leave no ``folder`` behind from here."""
    try:
        with caches.writing(folder) as staged:
            if staged is None:
                return
            staged.mkdir()
            for name, file in packed.items():
                with lzma.open(file) as source, open(staged / name, "wb") as out:
                    shutil.copyfileobj(source, out)
            shutil.copy(manifest, staged / saved_graphs.MANIFEST)
            for name, text in (texts or {}).items():
                (staged / name).write_text(text)
    except (OSError, EOFError, lzma.LZMAError):
        pass


def compile_own_in_background(options, checkpoint: str | Path) -> None:
    """Compile this CPU's own graph of the build of ``checkpoint`` in a niced
    process of its own (one at a time), saved for the next run."""
    if os.environ.get(BACKGROUND, "1") == "0" or os.environ.get("CI"):
        return
    graphs = caches.folder("graphs")
    lock = graphs / ".compiling-own-graph"
    try:
        pid = int(lock.read_text())
        os.kill(pid, 0)
        return  # one is running
    except (OSError, ValueError):
        pass
    log = graphs / "own-graph-compile.log"
    env = dict(os.environ, **{USE: "0", BACKGROUND: "0"})
    try:
        graphs.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            child = subprocess.Popen([sys.executable, "-m", "model.portable", "own", json.dumps(asdict(options)),
                                      str(checkpoint)],
                                     cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=lambda: os.nice(19))
        lock.write_text(str(child.pid))
    except OSError:  # the cache cannot be written: the graph it would compile could not be saved either
        return
    say(f"compiling this CPU's own graph ({cpu.native_path(cpu.flags())} kernels) in the background for the "
        f"next run ({BACKGROUND}=0 turns this off; log: {log})")
