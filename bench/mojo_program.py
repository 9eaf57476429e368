"""Build one of the bench's standalone Mojo programs and run it.

``bench.arithmetic`` and ``bench.sections`` time the machine with small Mojo
programs (no MAX graph around them), built with the mojo compiler that ships
in the max wheel. Their output is ``name value`` lines.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def run(source: Path, *args: str) -> str:
    """Build ``source`` with ``mojo build -O3`` and return what it prints."""
    from mojo.run import subprocess_run_mojo

    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / source.stem
        built = subprocess_run_mojo(["build", "-O3", str(source), "-o", str(binary)], capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"{source.name} did not build:\n{built.stderr}")
        return subprocess.run([str(binary), *args], capture_output=True, text=True, check=True).stdout
