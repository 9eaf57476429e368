"""Build one of the bench's standalone Mojo programs and run it.

``bench.arithmetic`` and ``bench.sections`` time the machine with small Mojo
programs (no MAX graph around them), built with the mojo compiler that ships
in the max wheel. Their output is ``name value`` lines. Each program is built
once per version of its sources and of MAX, into the project's cache folder
(``programs/``; model/caches.py).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from model import caches


def built(source: Path, include: Path | None = None) -> Path:
    """``source`` built with ``mojo build -O3`` (``include``: a folder of Mojo
    packages it imports), or the binary an earlier run built from the same
    sources with the same MAX."""
    from mojo.run import subprocess_run_mojo

    digest = hashlib.sha256(importlib.metadata.version("max").encode() + b"\0" + source.read_bytes())
    for path in sorted(include.rglob("*.mojo")) if include else []:
        digest.update(str(path.relative_to(include)).encode() + b"\0" + path.read_bytes())
    binary = caches.folder("programs") / f"{source.stem}_{digest.hexdigest()[:20]}"
    if binary.is_file():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging.", dir=binary.parent))  # two runs building at once both succeed
    try:
        flags = ["-I", str(include)] if include else []
        done = subprocess_run_mojo(["build", "-O3", *flags, str(source), "-o", str(staging / binary.name)],
                                   capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{source.name} did not build:\n{done.stderr}")
        os.replace(staging / binary.name, binary)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return binary


def run(source: Path, *args: str, include: Path | None = None) -> str:
    """Run ``source``'s program (built once) and return what it prints."""
    return subprocess.run([str(built(source, include)), *args], capture_output=True, text=True, check=True).stdout
