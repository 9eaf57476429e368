"""Your code: one file per step. Fill in the TODOs, then check a step with
``pixi run sNN`` (or ``python3.13 tasks.py sNN`` without pixi).

Your later steps import your earlier ones (``from steps.step_07 import ...``),
so the model you finish with is built from your code. A file copied from
``solutions/`` into this folder still imports ``solutions.solution_NN``, and
would quietly run the reference step instead of yours: whenever this package
is imported (the checker, ``test-all``, ``generate --impl steps``), every such
import is named on stderr, one line each, with the line to change: once, not
again in the processes it starts (the server's engine imports this package too).
"""

import ast as _ast
import os as _os
import sys as _sys
from pathlib import Path as _Path


def solution_imports(folder: _Path) -> list[str]:
    """One line per import of ``solutions`` in the ``step_*.py`` files of ``folder``."""
    found = []
    for path in sorted(folder.glob("step_*.py")):
        try:
            tree = _ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue  # the checker reports a file it cannot read
        for node in _ast.walk(tree):
            names = ([node.module or ""] if isinstance(node, _ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, _ast.Import) else [])
            for name in names:
                if name == "solutions" or name.startswith("solutions."):
                    step = name.removeprefix("solutions.solution_") if name.startswith("solutions.solution_") else "NN"
                    found.append(f"note: steps/{path.name} line {node.lineno} imports {name}, so it runs the "
                                 f"reference step {step}, not yours: change it to steps.step_{step}")
    return found


_NAMED = "GPT2_MAX_STEPS_IMPORTS_NAMED"  # set once they are named: the processes this one starts inherit it
if not _os.environ.get(_NAMED):
    for _line in solution_imports(_Path(__file__).resolve().parent):
        print(_line, file=_sys.stderr)
    _os.environ[_NAMED] = "1"
