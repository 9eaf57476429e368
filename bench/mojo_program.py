"""Build one of the bench's standalone Mojo programs and run it.

``bench.arithmetic`` and ``bench.sections`` time the machine with small Mojo
programs (no MAX graph around them), built with the mojo compiler that ships
in the max wheel. Their output is ``name value`` lines. Each program is built
once per version of its sources, of MAX and of the build, and per CPU (it is
built for this one), into the project's cache folder (``programs/``;
model/caches.py).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import subprocess
from pathlib import Path

from model import caches, cpu
from model.layers.custom_op import run_mojo

FLAGS = ("-O3",)


def built(source: Path, include: Path | None = None) -> Path:
    """``source`` built with ``mojo build -O3`` (``include``: a folder of Mojo
    packages it imports), or the binary an earlier run built from the same
    sources with the same MAX for the same CPU."""
    flags = [*FLAGS, *(["-I", str(include)] if include else [])]
    digest = hashlib.sha256("\0".join([importlib.metadata.version("max"), platform.machine(), *sorted(cpu.flags()),
                                       *flags]).encode() + b"\0" + source.read_bytes())
    for path in sorted(include.rglob("*.mojo")) if include else []:
        digest.update(str(path.relative_to(include)).encode() + b"\0" + path.read_bytes())
    binary = caches.folder("programs") / f"{source.stem}_{digest.hexdigest()[:20]}"
    return caches.made_once(binary, lambda staging: run_mojo("build", *flags, str(source), "-o", str(staging)))


def run(source: Path, *args: str, include: Path | None = None) -> str:
    """Run ``source``'s program (built once) and return what it prints."""
    return subprocess.run([str(built(source, include)), *args], capture_output=True, text=True, check=True).stdout
