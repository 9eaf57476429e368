"""Imported first by the scripts that run Hugging Face in an interpreter with torch
(bench/hf_baseline.py, hf_logits.py, hf_server.py, each run as ``python bench/SCRIPT.py``).

A script's folder comes first on its path, and this one holds a kernels.py, while
transformers imports a ``kernels`` package of its own: the folder is moved to the end of
the path, where bench/measure.py is still found.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
