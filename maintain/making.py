"""What every kind's make shares: empty caches, the files kept when the same, the facts, MAX's notice."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from artifacts import facts as artifact_facts
from artifacts import files
from artifacts.facts import ROOT, SHIPPED, max_version
from artifacts.targets import Target
from model import caches, cpu
from model.max_internals import WARM_STORE


def empty_caches_env(folder: Path, **more: str) -> dict[str, str]:
    """This environment with MAX's cache and the project's cache in ``folder``
    (empty), the project importable, no kernel path forced and no eager
    kernels named: where every make runs its children."""
    env = dict(os.environ, MODULAR_CACHE_DIR=str(folder / "modular"), **{caches.CACHE: str(folder / "project")},
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), **more)
    env.pop(cpu.ENV, None)
    env.pop(WARM_STORE, None)  # MAX's eager kernels from a store named by this process: not empty caches
    env.pop("MAX_EAGER_EXECUTOR", None)
    return env


def ship(kind: str, name: str, target: Target, made_from: dict, made: list[Path], pack: Callable[[list[Path], Path],
         list[dict]], made_by: str, shaping: tuple[str, ...] | None = None) -> bool:
    """The artifact of ``kind`` of ``name`` for ``target``, made of the files ``made``, shipped:
    packed by ``pack(made, folder)`` (which writes the packed files and returns their facts) and
    its facts written, unless the artifact shipped is the same (made from the same, by the same
    MAX, of files of the same names): MAX does not compile the same graph to the same bytes
    twice, so the files already there are kept and the repository's history does not grow by
    them at each make. ``shaping``: the keys of ``made_from`` that shape the files (default:
    every one). True when kept."""
    out = artifact_facts.folder(kind, name, target.name)
    before = artifact_facts.read(out)
    shaped = lambda facts: {k: v for k, v in facts.items() if shaping is None or k in shaping}  # noqa: E731
    same = (before is not None and shaped(before["made_from"]) == shaped(made_from) and before["max"] == max_version()
            and before["target"] == target.cpu and sorted(f["name"] for f in before["files"]) == sorted(
                p.name for p in made)
            and all((out / f["packed"]).is_file() for f in before["files"]))
    if same:
        entries = before["files"]
    else:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        entries = pack(made, out)
    artifact_facts.write(out, {"kind": kind, "name": name, "level": target.name, "target": target.cpu,
                               "max": max_version(), "made_from": made_from, "files": entries,
                               "made_by": made_by})
    write_notice()
    return same


def pack_each(made: list[Path], out: Path) -> list[dict]:
    """Each file compressed on its own (``<name>.xz``), MAX's manifest as it is."""
    entries = []
    for path in made:
        packed = path.name if path.suffix == ".json" else path.name + ".xz"
        (shutil.copy if packed == path.name else files.pack_xz)(path, out / packed)
        entries.append(files.entry(path, packed))
    return entries


def pack_one_archive(made: list[Path], out: Path, archive: str = "kernels.tar.xz") -> list[dict]:
    """Every file in one archive (byte for byte the same for the same files)."""
    files.pack_archive(made, out / archive)
    return [files.entry(path, archive) for path in sorted(made, key=lambda p: p.name)]


ATTRIBUTION = ("MAX is licensed by Modular Inc under the Modular MAX Community License and has been modified by "
               "the GPT-2 on MAX project. Copyright Modular Inc IN NO EVENT SHALL MODULAR INC BE LIABLE FOR ANY "
               "CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING "
               "FROM, OUT OF OR IN CONNECTION WITH USE OF MAX OR ANY DERIVATIVE WORK THEREOF.")


def write_notice() -> None:
    """A compiled file holds MAX's kernels in object code: the licence's terms
    (section 1.1.3: displayed with each copy) and its attribution (1.1.4) go
    beside the shipped artifacts, the terms copied from the installed MAX."""
    terms = importlib.metadata.distribution("max").read_text("LICENSE") or ""
    (SHIPPED / "MAX-LICENSE.txt").write_text(terms)
    (SHIPPED / "NOTICE").write_text(
        f"Each compiled file in the folders below was made by `python -m maintain make` with MAX {max_version()}\n"
        "(shipped/<kind>/<name>/<level>/facts.json says which command made it) and contains MAX's kernels\n"
        "in object code, distributed under the terms in MAX-LICENSE.txt.\n\n" + ATTRIBUTION + "\n")
