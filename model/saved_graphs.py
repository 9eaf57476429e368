"""Compiled graphs saved on disk, so that a warm start skips MAX's compile.

MAX keeps its own compile cache, but even a graph it has cached took ~3-5 s
to come back on these machines (``InferenceSession.compile``). A compiled
graph can instead be written out as a MEF (MAX's executable format): MAX's
``MefStore`` does that, given a directory. A saved graph is then read back
and driven directly (``SavedGraph``: nothing traced). The weights
are not in the file; they are bound when the graph is loaded.

A MEF is only valid for exactly the graph it was compiled from, so the graph
is *named* by a digest of everything that shapes it: the MAX version, the
CPU's kernel path (model/cpu.py: a graph compiled for AVX-512 must not run
on an AVX2 machine that shares the cache folder), the sources of the build
(model/) and of the course's implementation (solutions/ or the learner's
steps/), the checkpoint's config, the placement and the build options. Any
change to any of them gives a new name, hence a fresh compile. Beside the
MEF, ``facts.json`` keeps what the build learnt while tracing (how many
quantized layers the graph calls). A graph that is not a GPT-2 build, saved
in a unit (model/together.py's Other), is named instead by what its traced
body computes, the Mojo kernels, the MAX version, the CPU and kernel path
(model/together.py's ``Other.name``).

Several graphs compiled as one unit (model/together.py) are saved as one
MEF, a *bundle*: each graph's folder then holds only its facts, which name
the bundle, the graph's name inside it and the prefix of its weights' names.
MAX binds every graph of an artifact when it loads one, so a graph loaded
from a bundle binds a one-element placeholder for each of the others'
weights; those graphs are never run.

A saved graph that fails to load (a MEF cut short, facts that are not JSON)
is set aside and made again (model/caches.py), a shipped one unpacked anew.

Where: ``graphs/`` in the project's cache folder (model/caches.py), one
folder per graph (~14 MB for GPT-2 124M) or bundle, and beside a graph's
folder a line to say at its first load (``<name>.note``: one compiled in the
background says so). Delete it to free the space; set
``GPT2_MAX_SAVED_GRAPHS=0`` to compile every time.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

from artifacts import atomic, files
from artifacts.mef import MANIFEST, the_mef
from model import caches

ROOT = Path(__file__).resolve().parent.parent
FACTS = "facts.json"  # what the build learnt while tracing the graph (load_gpt2)
NOTE = ".note"  # graphs/<name>.note: a line said once, by the first load of that saved graph
BUNDLE_MEF = "bundle.mef"  # several graphs compiled as one unit (model/together.py)
BUNDLE_WEIGHTS = "weights.json"  # each of the bundle's graphs' weights' names


def graph_name(options, config, cpu_description: str | None = None) -> str:
    """``gpt2_<digest>``: the digest of everything the compiled graph depends on
    (``options``: model/options.py's BuildOptions). ``cpu_description``: what
    the graph was compiled for, when not this CPU (model/graph_source.py's
    shipped graph)."""
    digest = hashlib.sha256()
    facts = {**machine_facts(cpu_description), "impl": options.impl,
             "config": asdict(config) if is_dataclass(config) else vars(config),
             "placement": [options.placement.kind, options.placement.dtype], "options": options.graph_facts()}
    digest.update(json.dumps(facts, sort_keys=True, default=str).encode())
    digest.update(sources_digest(options.impl).encode())
    return "gpt2_" + digest.hexdigest()[:20]


def machine_facts(cpu_description: str | None = None) -> dict:
    """What a compiled graph depends on beside its own build: MAX's version,
    the CPU it is compiled for and the kernel path asked for."""
    from model import cpu

    return {"max": importlib.metadata.version("max"),
            "cpu": cpu.describe() if cpu_description is None else cpu_description,
            "kernel_path": os.environ.get(cpu.ENV, "auto")}


def sources_digest(impl: str) -> str:
    """A digest of the files a graph of ``impl`` can depend on (``sources``)."""
    return files.files_digest(sources(impl), ROOT)


# The build of a graph (model/graph.py): it and the files it imports, at any depth of their code, build it.
BUILD = Path("model", "graph.py")


def build_files() -> list[Path]:
    """model/'s Python files that the build imports, from ``BUILD`` on (read from their
    source): a saved graph is named by these, so editing the CLI or a tool renames none."""
    import ast

    found, todo = set(), [ROOT / BUILD]
    while todo:
        path = todo.pop()
        if path in found or not path.is_file():
            continue
        found.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module, *(f"{node.module}.{a.name}" for a in node.names)] \
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                if name == "model" or name.startswith("model."):
                    module = ROOT.joinpath(*name.split("."))
                    todo += [module.with_suffix(".py"), module / "__init__.py"]
    return sorted(found)


def sources(impl: str) -> list[Path]:
    """The files a built graph can depend on: the build's Python (``build_files``), its Mojo
    kernels (model/kernels) and the course's blocks: the solutions, or the learner's steps
    wherever Python imports them from (a folder outside the repository first on PYTHONPATH:
    its files, not the repository's skeletons, name the graph)."""
    from model.course import steps_folder

    course = ROOT / "solutions" if impl == "solutions" else steps_folder()
    return sorted([*build_files(), *(ROOT / "model").rglob("*.mojo"), *course.glob("*.py")])


@dataclass
class Store:
    """Where one graph's MEF is loaded from or saved to.

    ``session`` is the InferenceSession to compile with, or to run the saved
    graph in (None: MAX's default one, nothing saved); ``facts``, what the
    build learnt while tracing it, when the MEF was there (``loaded``);
    ``mef``: the file, when the graph is to be driven directly, and
    ``artifact``, MAX's reading of it; ``damaged``: the saved graph failed
    to load and was set aside."""

    name: str
    session: object = None
    staging: Path | None = None
    mef: Path | None = None
    facts: dict | None = None
    artifact: object = None
    damaged: bool = False

    @property
    def loaded(self) -> bool:
        return self.facts is not None

    @property
    def direct(self) -> bool:
        """Whether the saved graph is driven as it is (``run``), nothing traced."""
        return self.artifact is not None

    def keep(self, facts: dict) -> None:
        """After compiling: write ``facts`` beside the saved MEF and move both
        into place, atomically (two processes compiling the same graph at
        once both succeed; one wins)."""
        if self.staging is None:
            return
        with atomic.saving(self.staging, caches.folder("graphs") / self.name):
            (self.staging / FACTS).write_text(json.dumps(facts))
            _drop_unsaved(self.name)

    def discard(self) -> None:
        """Drop a half-written MEF (the compile failed or was interrupted)."""
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)

    def run(self, weights: dict) -> SavedGraph:
        """The saved graph, loaded into ``session`` with ``weights`` bound."""
        return SavedGraph(self.session, self.mef, weights, self.facts, self.artifact)


class SavedGraph:
    """A saved graph driven directly: like MAX's CompiledCallable it holds
    the engine's Model (``engine_model``, which ``GPT2._run`` executes on
    driver buffers, inputs in graph order), but nothing is traced. Tracing
    GPT-2 124M's graph again only to look its MEF up cost a noticeable part
    of every start, more with custom ops (MAX analyses their library when a
    traced graph first calls one); loading the MEF and binding the weights is
    a small part of that."""

    def __init__(self, session, mef: Path, weights: dict, facts: dict | None = None, artifact=None) -> None:
        import numpy as np
        from max.driver import Buffer
        from max.engine import read

        # As Module.compile hands them over: driver buffers (zero-copy views
        # of writable arrays). Raw numpy int8/float16 arrays crashed the
        # Q8_0 graph at its first call.
        registry = {k: Buffer.from_dlpack(v) for k, v in weights.items()}
        artifact = artifact or read(mef)
        bundle = (facts or {}).get("bundle")
        if bundle is None:
            self.engine_model = session.init(artifact, weights_registry=registry)
            return
        registry = {bundle["prefix"] + k: v for k, v in registry.items()}
        placeholder = Buffer.from_dlpack(np.zeros(1, np.float32))
        others = json.loads((mef.parent / BUNDLE_WEIGHTS).read_text())
        for graph, names in others.items():
            if graph != bundle["graph"]:
                registry |= dict.fromkeys(names, placeholder)
        self.engine_model = session.init_all(artifact, weights_registry=registry)[bundle["graph"]]


def is_saved(name: str) -> bool:
    """Whether ``name``'s graph is saved (and will be loaded, not compiled):
    answered from the folder alone, before MAX is imported."""
    if name in _HELD:
        return True
    folder = caches.folder("graphs") / name
    facts = saved_facts(name) if caches.enabled() else None
    return facts is not None and ((folder / MANIFEST).is_file() or bundle_mef(facts) is not None)


def saved_facts(name: str) -> dict | None:
    """The facts saved with ``name``'s graph; None when there are none, or
    when they cannot be read (the folder is then set aside)."""
    folder = caches.folder("graphs") / name
    try:
        facts = json.loads((folder / FACTS).read_text())
        if not isinstance(facts, dict):
            raise ValueError(f"{FACTS} holds no JSON object")
        return facts
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        atomic.set_aside(folder, "a saved graph", exc)
        return None


# Graphs this process uses without a saved copy: a shipped graph read from
# its compressed file where the cache cannot be written (model/graph_source.py);
# and those found unreadable, not held again.
_HELD: dict[str, tuple[dict, object]] = {}
_UNREADABLE: set[str] = set()


def hold(name: str, facts: dict, open_mef) -> None:
    """``name``'s graph used from ``open_mef()`` (a binary stream of its MEF)
    for the rest of this process; ``facts``: the build's, as saved beside it."""
    if name not in _UNREADABLE:
        _HELD[name] = (facts, open_mef)


def bundle_mef(facts: dict) -> Path | None:
    """The bundle a saved graph's ``facts`` say it is in, when that is saved."""
    if "bundle" not in facts:
        return None
    mef = caches.folder("graphs") / facts["bundle"]["name"] / BUNDLE_MEF
    return mef if mef.is_file() else None


def keep_bundle(compiled, members: list[tuple[str, dict]], weights: dict[str, list[str]]) -> None:
    """Save ``compiled`` (MAX's artifact of several graphs compiled as one unit)
    as a bundle, and each of its ``members``: a graph's name (``graph_name``,
    or an Other's) and its facts, which say its graph's name in the bundle
    (``graph``) and its weights' prefix (``prefix``). ``weights``: each
    graph's weights' names. A member saved already is left as it is; one
    whose folder names a bundle that is gone is saved again."""
    if not caches.enabled():
        return
    graphs = caches.folder("graphs")
    name = "bundle_" + hashlib.sha256(" ".join(sorted(n for n, _ in members)).encode()).hexdigest()[:20]
    with atomic.writing(graphs / name) as staged:
        if staged is None:
            return
        staged.mkdir()
        compiled.export_mef(staged / BUNDLE_MEF)
        (staged / BUNDLE_WEIGHTS).write_text(json.dumps(weights))
    for member, facts in members:
        with atomic.writing(graphs / member) as staged:
            if staged is not None:
                staged.mkdir()
                (staged / FACTS).write_text(json.dumps({**facts, "bundle": {**facts["bundle"], "name": name}}))
                _drop_unsaved(member)


def _drop_unsaved(name: str) -> None:
    """``name``'s folder removed when it does not hold a saved graph (its
    bundle deleted by hand), so that saving the graph again is not refused."""
    folder = caches.folder("graphs") / name
    if folder.is_dir() and not folder.is_symlink() and not is_saved(name):
        shutil.rmtree(folder, ignore_errors=True)


def alias(name: str, saved: str) -> None:
    """``name`` made another name of the saved graph ``saved`` (a link to its
    folder), so that a later load under ``name`` finds it as it is."""
    if not caches.enabled():
        return
    try:
        os.symlink(saved, caches.folder("graphs") / name, target_is_directory=True)
    except OSError:  # another process made it first, a file system without links: found by tracing again
        pass


def store_for(name: str, device, direct: bool = True) -> Store:
    """Load ``name``'s saved MEF if there is one, else save it when compiled.

    ``direct``: the saved graph will be driven as it is (``Store.run``),
    which needs the weights exactly as the graph takes them; else it is
    found again by tracing (MAX's store matches the traced graph). bfloat16
    builds take the second way: their weights were once cast by the compile
    call; now they arrive cast (gpt2.as_bfloat16), but driving a bfloat16
    graph directly has not been run on a GPU yet (docs/gpu.md)."""
    if not caches.enabled():
        return Store(name)
    from max.engine import InferenceSession

    damaged = False
    if name in _HELD or is_saved(name):
        store = (_held if name in _HELD else _saved)(name, device, direct)
        if store is not None:
            return store
        damaged = True
    staging = atomic.staging(caches.folder("graphs"))
    if staging is None:  # the cache cannot be written: compiled, not saved
        return Store(name, damaged=damaged)
    return Store(name, InferenceSession(devices=[device], export_mefs=staging), staging=staging, damaged=damaged)


def _saved(name: str, device, direct: bool) -> Store | None:
    """``store_for``'s saved graph, loaded; None when it fails to (set aside)."""
    from max.engine import InferenceSession, read

    folder = entry = caches.folder("graphs") / name
    try:
        facts = saved_facts(name)
        mef = bundle_mef(facts)  # a bundle is only driven directly (model/together.py: CPU builds)
        if mef is None:
            # The MEF carries the compiled custom kernels too: no library needed.
            mef = the_mef(folder)
        entry = mef.parent
        artifact = read(mef)  # a MEF cut short or damaged fails here
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        atomic.set_aside(entry, "a saved graph", exc)
        return None
    _say_note(name)
    if direct or entry != folder:
        return Store(name, InferenceSession(devices=[device]), mef=mef, facts=facts, artifact=artifact)
    return Store(name, InferenceSession(devices=[device], precompiled_mefs=folder), facts=facts)


def _held(name: str, device, direct: bool) -> Store | None:
    """``store_for``'s graph held by this process (``hold``), read; None when it cannot be."""
    from max.engine import InferenceSession, read

    facts, open_mef = _HELD[name]
    try:
        with open_mef() as mef:
            return Store(name, InferenceSession(devices=[device]), facts=facts, artifact=read(mef))
    except (OSError, EOFError, RuntimeError, ValueError) as exc:  # (lzma's errors are ValueErrors and EOFErrors)
        del _HELD[name]
        _UNREADABLE.add(name)
        print(f"note: the shipped graph is damaged ({type(exc).__name__}: {exc}): compiled instead",
              file=sys.stderr, flush=True)
        return None


def note_first_load(name: str, line: str) -> None:
    """``line`` said once, on stderr, by the first process to load ``name``'s
    saved graph (one compiled out of the user's sight says so when it is used)."""
    if not caches.enabled():
        return
    with atomic.writing(caches.folder("graphs") / (name + NOTE)) as staged:  # never read half written
        if staged is not None:
            staged.write_text(line)


def _say_note(name: str) -> None:
    note = caches.folder("graphs") / (name + NOTE)
    try:
        line = note.read_text()
        note.unlink()  # (of two processes loading it at once, the one that removes it says it)
    except OSError:
        return
    print(line, file=sys.stderr, flush=True)
