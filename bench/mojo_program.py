"""Build one of the bench's standalone Mojo programs and run it.

``bench.arithmetic`` and ``bench.sections`` time the machine with small Mojo
programs (no MAX graph around them), built with the mojo compiler that ships
in the max wheel. Their output is ``name value`` lines.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def run(source: Path, *args: str, include: Path | None = None) -> str:
    """Build ``source`` with ``mojo build -O3`` (``include``: a folder of
    Mojo packages it imports) and return what it prints."""
    from mojo.run import subprocess_run_mojo

    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / source.stem
        flags = ["-I", str(include)] if include else []
        built = subprocess_run_mojo(["build", "-O3", *flags, str(source), "-o", str(binary)],
                                    capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"{source.name} did not build:\n{built.stderr}")
        return subprocess.run([str(binary), *args], capture_output=True, text=True, check=True).stdout
