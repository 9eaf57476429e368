"""``python -m model.portable make`` / ``check``: the shipped graphs made, and checked against this code.

See model/portable/__init__.py for what is shipped and when the app uses it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from model import caches, cpu, saved_graphs, targets
from model.max_internals import WARM_STORE
from model.portable import (
    MODELS,
    ROOT,
    SHIPPED,
    TARGETS,
    Target,
    config_facts,
    graph_digest,
    kernels_digest,
    max_version,
    shipped_config,
    shipped_facts,
)


def compile_own(options_json: str, checkpoint: str) -> int:
    """The background compile of this CPU's own graph (``compile_own_in_background``'s
    child): compiled and saved, and the run that first loads it told so in one line."""
    from model.gpt2 import load_gpt2, opened
    from model.options import BuildOptions

    options = BuildOptions(**json.loads(options_json))
    gpt2 = load_gpt2(checkpoint, options, with_tokenizer=False)
    if gpt2.saved_graph:
        return 0  # another process saved it first (a second background compile, or a run told to compile)
    _, _, graph_config = opened(checkpoint, options)
    saved_graphs.note_first_load(
        saved_graphs.graph_name(options, graph_config),
        f"using this CPU's own graph ({cpu.native_path(cpu.flags())} kernels), compiled in the background "
        f"by an earlier run in {gpt2.compile_seconds:.0f} s")
    return 0


def empty_caches_env(folder: Path, **more: str) -> dict[str, str]:
    """This environment with MAX's cache and the project's cache in ``folder``
    (empty), the project importable, no kernel path forced: where the make
    commands (this one, checker/eager_kernels') run their child."""
    env = dict(os.environ, MODULAR_CACHE_DIR=str(folder / "modular"), **{caches.CACHE: str(folder / "project")},
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), **more)
    env.pop(cpu.ENV, None)
    env.pop(WARM_STORE, None)  # MAX's eager kernels from a store named by this process: not empty caches
    return env


def traced_digest(options, config) -> str:
    """``graph_digest`` of the graph this code builds for ``options`` (traced,
    not compiled), as for the CPUs a shipped graph is compiled for."""
    from model.gpt2 import traced_graph

    with cpu.as_shipped():
        return graph_digest(traced_graph(config, options))


def make(model: str, checkpoint: str, target: Target, out: Path) -> int:
    """Compile ``model``'s shipped build (from ``checkpoint``) for ``target``
    in this process (whose MAX and project caches the caller pointed at
    empty folders), and write it to ``out``: the MEF compressed, MAX's
    manifest, and ``facts.json``."""
    # Compiled, never initialised here (before the process's first device): this machine need not
    # run the target's code, which another architecture's, or x86-64-v3's on an older x86-64, could not.
    targets.enter_virtual_mode(targets.Target(target.runs_on, cpu=target.descriptor))
    from model.course import config_class
    from model.gpt2 import load_gpt2
    from model.options import BuildOptions
    from weights import open_checkpoint

    options = BuildOptions(device="cpu", dtype="float32")
    config = open_checkpoint(checkpoint).config_as(config_class(options.impl))
    if config_facts(config) != config_facts(shipped_config(model)):
        raise SystemExit(f"{checkpoint} is not shaped as {model}")
    gpt2 = load_gpt2(checkpoint, options, with_tokenizer=False)
    [saved] = [p for p in caches.folder("graphs").iterdir() if p.is_dir() and saved_graphs.is_saved(p.name)]
    [entry] = json.loads((saved / saved_graphs.MANIFEST).read_text())["graphs"]
    mef = saved / entry["key"]
    digest = traced_digest(options, config)
    version = max_version()
    file = f"{model}-{target.level}-max{version}-{digest}.mef.xz"
    try:
        before = json.loads((out / "facts.json").read_text())
    except (OSError, ValueError):
        before = {}
    # The same graph (its name holds the traced body's digest) compiles to other bytes each time:
    # the file already there is kept, so that git's history does not grow by one at each make.
    kernels = kernels_digest()
    same = (before.get("file") == file and before.get("mef") == entry["key"] and before.get("kernels") == kernels
            and before.get("target") == target.descriptor and "mef_bytes" in before
            and (out / file).is_file() and (out / saved_graphs.MANIFEST).is_file())
    if not same:
        for old in out.glob("*.mef.*"):
            old.unlink()
        out.mkdir(parents=True, exist_ok=True)
        with open(mef, "rb") as raw, lzma.open(out / file, "wb", preset=9) as packed:
            shutil.copyfileobj(raw, packed)
        shutil.copy(saved / saved_graphs.MANIFEST, out / saved_graphs.MANIFEST)
    facts = {"model": model, "max": version, "level": target.level, "target": target.descriptor, "graph": digest,
             "kernels": kernels, "config": config_facts(config),
             "sources": saved_graphs.sources_digest(options.impl), "file": file, "mef": entry["key"],
             "mef_bytes": before["mef_bytes"] if same else mef.stat().st_size,
             "build": json.loads((saved / saved_graphs.FACTS).read_text()),
             "made_by": "python -m model.portable make"}
    (out / "facts.json").write_text(json.dumps(facts, indent=1) + "\n")
    write_notice(out.parent.parent, version)
    print(f"{out / file}: {mef.stat().st_size / 1e6:.2f} MB compiled for {target.level}, "
          f"{(out / file).stat().st_size / 1e6:.2f} MB compressed; {gpt2.compile_seconds:.1f} s to compile"
          + ("; the same graph as the file already there, which is kept" if same else ""))
    return 0


ATTRIBUTION = ("MAX is licensed by Modular Inc under the Modular MAX Community License and has been modified by "
               "the GPT-2 on MAX project. Copyright Modular Inc IN NO EVENT SHALL MODULAR INC BE LIABLE FOR ANY "
               "CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING "
               "FROM, OUT OF OR IN CONNECTION WITH USE OF MAX OR ANY DERIVATIVE WORK THEREOF.")


def write_notice(out: Path, version: str, what: str = "Each compiled graph in the folders below was made by "
                 "`python -m model.portable make` (the app's: <model>/<level>/) or\n`python -m serve.shipped make` "
                 "(the server's: serve/<model>/<level>/)") -> None:
    """A compiled file holds MAX's kernels in object code: the licence's
    terms (section 1.1.3: displayed with each copy) and its attribution
    (1.1.4) go beside it, the terms copied from the installed MAX.
    ``what``: which file it is and the command that made it."""
    terms = importlib.metadata.distribution("max").read_text("LICENSE") or ""
    (out / "MAX-LICENSE.txt").write_text(terms)
    (out / "NOTICE").write_text(
        f"{what} with MAX {version}\n"
        "and contains MAX's kernels in object code, distributed under the terms in MAX-LICENSE.txt.\n\n"
        + ATTRIBUTION + "\n")


def check() -> int:
    """Whether each shipped graph is what ``make`` would write for this code: 0 if so."""
    from model.options import BuildOptions

    options = BuildOptions(device="cpu", dtype="float32")
    version = max_version()
    failed = 0
    for model in MODELS:
        digest = traced_digest(options, shipped_config(model))
        for target in TARGETS.values():
            failed |= check_one(model, target, version, digest, options)
    return failed


def check_one(model: str, target: Target, version: str, digest: str, options) -> int:
    """``check`` for ``model``'s graph shipped for ``target``, whose traced body is ``digest``: 0 if it matches."""
    facts = shipped_facts(model, target)
    folder = target.folder(model)
    where = folder.relative_to(ROOT)
    remake = f"python -m model.portable make --model {model} --target {target.level}"
    if facts is None:
        print(f"no shipped graph in {where}: {remake}")
        return 1
    stale = [what for what, ok in (("MAX's version", facts["max"] == version),
                                   ("the graph", facts["graph"] == digest),
                                   ("the Mojo kernels", facts.get("kernels") == kernels_digest()),
                                   ("the model", facts.get("model") == model),
                                   ("the target", facts["level"] == target.level
                                    and facts["target"] == target.descriptor),
                                   ("the file", (folder / facts["file"]).is_file()),
                                   ("MAX's manifest", (folder / saved_graphs.MANIFEST).is_file()))
             if not ok]
    if stale:
        print(f"{model}'s graph shipped for {target.level} is stale ({', '.join(stale)}): {remake}")
        return 1
    print(f"{model}'s graph shipped for {target.level} matches this code: {where / facts['file']}")
    if facts["sources"] != saved_graphs.sources_digest(options.impl):
        print("  (made from other source files: a first run traces the model to compare, seconds; "
              "make it again to skip that)")
    return 0


def main(argv: list[str] | None = None) -> int:
    import model.portable as shipped

    p = argparse.ArgumentParser(prog="python -m model.portable", description=shipped.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=shipped.__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, metavar="{make,check}")
    made = sub.add_parser("make", help=f"compile the graphs of {' and '.join(MODELS)} for {' and '.join(TARGETS)} "
                          "from empty caches (each in a process of its own), write them")
    made.add_argument("--model", choices=MODELS, action="append",
                      help="only this model's graphs (again for more; default: every one); gpt2's is compiled "
                           "from a random 124M checkpoint written once into the cache folder (~500 MB)")
    made.add_argument("--target", choices=TARGETS, action="append",
                      help="only this target (again for more; default: every one)")
    made.add_argument("--out", type=Path, default=SHIPPED,
                      help="where to write them, a folder per model and target (default: %(default)s)")
    made.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # the child, caches already empty
    made.add_argument("--checkpoint", help=argparse.SUPPRESS)  # the child's: what to compile from
    sub.add_parser("check", help="exit 1 when a shipped graph no longer matches what this code traces, "
                   "or was made with other Mojo kernels")
    own = sub.add_parser("own")  # the background compile of this CPU's own graph (not listed)
    own.add_argument("options")
    own.add_argument("checkpoint")
    args = p.parse_args(argv)
    if args.command == "check":
        return check()
    if args.command == "own":
        return compile_own(args.options, args.checkpoint)
    if args.here:
        [model], [level] = args.model, args.target
        return make(model, args.checkpoint, TARGETS[level], args.out / model / level)
    for model in args.model or MODELS:
        # The demo's own; for GPT-2 124M a random one of its shape (the graph holds no weights), written once
        # into this process's cache folder: the child's caches are empty.
        checkpoint = str(targets.checkpoint(model))
        for level in args.target or TARGETS:
            with tempfile.TemporaryDirectory(prefix="gpt2-portable-") as empty:
                env = empty_caches_env(Path(empty))
                command = [sys.executable, "-m", "model.portable", "make", "--here", "--model", model,
                           "--target", level, "--checkpoint", checkpoint, "--out", str(args.out.resolve())]
                if done := subprocess.run(command, env=env, cwd=ROOT).returncode:
                    return done
    return 0


if __name__ == "__main__":
    sys.exit(main())
