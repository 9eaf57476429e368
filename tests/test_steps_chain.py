"""A file copied from solutions/ into steps/ keeps importing solutions.*, which
would silently take the learner's own earlier steps out of the chain: the
steps package names every such import when it is imported (the checker,
test-all and `generate --impl steps` all import it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import pythonpath

from checker.skeleton import ROOT, SOLUTIONS


def test_a_copied_solution_is_named_with_the_line_to_change(tmp_path):
    # A learner's folder: every step a verbatim copy of its solution, as a
    # learner who copies solutions to move on would have it.
    steps = tmp_path / "steps"
    steps.mkdir()
    shutil.copy(ROOT / "steps" / "__init__.py", steps / "__init__.py")
    for solution in SOLUTIONS.glob("solution_*.py"):
        shutil.copy(solution, steps / solution.name.replace("solution_", "step_"))
    # Importing the package is what the checker, test-all and --impl steps do first; a process
    # it starts (as the server starts its engine's) imports it again and names nothing again.
    again = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import steps'], check=True)"
    done = subprocess.run([sys.executable, "-c", f"import steps; {again}"], cwd=tmp_path, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=pythonpath(tmp_path, ROOT)))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    text = (SOLUTIONS / "solution_10.py").read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if t.startswith("from solutions.solution_09 import"))
    assert (f"note: steps/step_10.py line {line} imports solutions.solution_09, so it runs the reference step 09, "
            "not yours: change it to steps.step_09") in lines
    assert all(line.startswith("note: steps/step_") for line in lines)
    assert len(lines) == len(set(lines))  # named once, not again by the child


def test_the_generated_skeletons_import_only_steps():
    done = subprocess.run([sys.executable, "-c", "import steps"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == ""
