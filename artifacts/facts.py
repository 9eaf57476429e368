"""One facts file for every kind of shipped artifact, and why one cannot run here.

``facts.json`` beside an artifact's files has the same keys for every kind:

    kind       what it is: app-graph, server-graphs or eager-kernels
    name       what it is of: a model (demo, gpt2), or max for MAX's own kernels
    level      the target it was compiled for (artifacts/targets.py's table)
    target     MAX's virtual CPU target it was compiled with
    max        the MAX version that made it: compiled code runs only under it
    made_from  what shaped it, a kind's own digests (the traced graph, the Mojo kernels, ...)
    files      its files: name, where packed, bytes, sha256 (artifacts/files.py)
    made_by    the command that made it
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
from pathlib import Path

from artifacts import atomic, targets

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "shipped"  # shipped/<kind>/<name>/<level>/: the artifacts shipped with the project
FACTS = "facts.json"
KEYS = ("kind", "name", "level", "target", "max", "made_from", "files", "made_by")


def folder(kind: str, name: str, level: str) -> Path:
    """Where the artifact of ``kind`` of ``name`` for ``level`` is shipped."""
    return SHIPPED / kind / name / level


def read(where: Path) -> dict | None:
    """The facts in ``where``; None where there are none or they are not this schema's."""
    try:
        facts = json.loads((where / FACTS).read_text())
    except (OSError, ValueError):
        return None
    return facts if isinstance(facts, dict) and tuple(facts) == KEYS else None


def write(where: Path, facts: dict) -> None:
    """``facts`` (this schema's keys, in order) into ``where``, whole or not at all."""
    if tuple(facts) != KEYS:
        raise ValueError(f"facts keys {tuple(facts)} are not {KEYS}")
    where.mkdir(parents=True, exist_ok=True)
    with atomic.writing(where / FACTS) as staged:
        if staged is None:
            raise OSError(f"{where} cannot be written")
        staged.write_text(json.dumps(facts, indent=1) + "\n")


def max_version() -> str:
    """The installed MAX's version."""
    return importlib.metadata.version("max")


def why_not_here(facts: dict, features: frozenset[str] | None = None) -> str:
    """Why the artifact ``facts`` describe cannot run in this process, in words; "" when it can:
    the MAX that made it, the system and architecture, and every CPU feature of its level
    (``features``: this CPU's, archspec's reading, unless given)."""
    version = max_version()
    if facts["max"] != version:
        return f"made with MAX {facts['max']}, this is MAX {version}"
    target = targets.TARGETS.get(facts["level"])
    if target is None:
        return f"made for {facts['level']}, a target this code does not know"
    if (platform.system(), targets.host_machine()) != (target.system, target.machine):
        return f"{target.system} {target.machine} code, this is {platform.system()} on {platform.machine()}"
    features = targets.host_features() if features is None else features
    if not features:
        return "this CPU's features could not be read"
    lacking = sorted(target.features() - features)
    if lacking:
        return f"this CPU lacks {', '.join(lacking)} ({target.name} needs them)"
    return ""
