"""checker/registry.py is the one list of steps: pixi.toml's tasks, the README's tables and
every step's files agree with it, and a new step's code is its two files and one row (its
pixi task and README row are then checked here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import pythonpath

from checker import registry
from checker.skeleton import ROOT

TASKS = tomllib.loads((ROOT / "pixi.toml").read_text())["tasks"]


def test_every_step_has_its_task_files_and_checks():
    for step in registry.STEPS:
        assert TASKS[step.task] == {"cmd": f"python -m checker {step.number}", "description": step.description}
        assert step.solution.is_file() and step.skeleton.is_file(), step.number
        module = step.checks()
        assert module.CHECKS and isinstance(module.USES_MAX, bool), step.number
    numbered = {name for name in TASKS if re.fullmatch(r"s\d\d", name)}
    assert numbered == {step.task for step in registry.STEPS}, "a check task without a step in checker/registry.py"
    on_disk = {p.stem.removeprefix("solution_") for p in (ROOT / "solutions").glob("solution_*.py")}
    assert on_disk == set(registry.by_number()), "a solution file without a row in checker/registry.py"


def test_each_solution_s_docstring_names_its_step_as_the_registry_does():
    """The book's page heading is the docstring's first line; the checker prints the registry's."""
    import ast

    for step in registry.STEPS:
        first = ast.get_docstring(ast.parse(step.solution.read_text())).splitlines()[0]
        assert first.startswith(f"{step.heading}: "), (step.number, first)


def test_the_readme_tables_list_the_steps_in_order():
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d\d) \|.*\| `pixi run s(\d\d)` \|$", readme, flags=re.M)
    assert all(number == task for number, task in rows), rows
    core, bonus = readme.split("**Bonus steps (optional)**")
    listed = lambda text: re.findall(r"^\| (\d\d) \|", text, flags=re.M)  # noqa: E731
    assert listed(core) == [s.number for s in registry.STEPS if not s.bonus]
    assert listed(bonus) == [s.number for s in registry.STEPS if s.bonus]


def test_show_and_the_book_have_a_picture_where_the_registry_names_one():
    from checker import pictures, show

    assert set(pictures.PICTURES) == {s.number for s in registry.STEPS if s.picture}
    assert set(show.SHOWS) == set(registry.by_number()), "every step can be shown"


# --- A new step: its solution, its checks and one row -----------------------------------------

STEP_17 = '''"""Bonus step 17: doubling a number.

What
    ``double(x)`` returns two times ``x``.

Check your work with ``pixi run s17``.
"""


def double(x: float) -> float:
    """Two times ``x``."""
    # BEGIN SOLUTION
    return 2 * x
    # END SOLUTION
'''

CHECKS_17 = '''"""Checks for bonus step 17: doubling."""

import numpy as np

from checker.harness import Check, StepContext, compare

USES_MAX = False


def check_double(ctx: StepContext) -> None:
    compare(np.asarray(ctx.call(ctx.learner.double, 3.0, what="double")), np.asarray(6.0), "double(3.0)", "times 2")


CHECKS = [Check("double(3.0) is 6.0", check_double, "return 2 * x")]
'''


def _copy_of_the_course(dest: Path) -> Path:
    """The parts of the tree the checker and the book read, copied (the real tree is not touched)."""
    for name in ("checker", "solutions", "steps", "docs", "weights/demo", "model", "artifacts"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.safetensors",
                                                                                "*.bin", "*.npz"))
    for name in ("tasks.py", "README.md", "mkdocs.yml", "LICENSE", "pixi.toml"):
        shutil.copy(ROOT / name, dest / name)
    return dest


def test_a_new_step_is_a_solution_a_checks_module_and_one_row(tmp_path):
    tree = _copy_of_the_course(tmp_path / "tree")
    (tree / "solutions" / "solution_17.py").write_text(STEP_17)
    (tree / "checker" / "checks" / "step_17.py").write_text(CHECKS_17)
    table = tree / "checker" / "registry.py"
    row = '    Step("16", "rotary causal attention", bonus=True),\n'
    assert row in table.read_text()
    table.write_text(table.read_text().replace(row, row + '    Step("17", "doubling a number", bonus=True),\n'))
    env = {**os.environ, "PYTHONPATH": pythonpath(tree)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=300)

    made = run("-m", "checker.skeleton")  # pixi run skeletons: writes steps/step_17.py
    assert made.returncode == 0, made.stdout + made.stderr
    assert "raise NotImplementedError" in (tree / "steps" / "step_17.py").read_text()
    passed = run("-m", "checker", "17", "--solution", "--no-color")
    assert passed.returncode == 0 and "Bonus step 17: 1 of 1 checks passed" in passed.stdout, passed.stdout
    todo = run("-m", "checker", "17", "--no-color")
    assert todo.returncode == 1 and "TODO" in todo.stdout, todo.stdout
    listed = run("-m", "checker", "--help")
    assert "bonus 13-17" in listed.stdout
    shown = run("-m", "checker.show", "17")
    assert shown.returncode == 2 and "nothing to show yet" in shown.stderr
    book = run("docs/book.py")
    assert book.returncode == 0, book.stdout + book.stderr
    assert (tree / "build" / "book" / "steps" / "step-17.md").read_text().startswith("# Bonus step 17")


def test_the_books_navigation_has_a_page_per_step(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "docs"))
    import book

    monkeypatch.setattr(registry, "STEPS", (*registry.STEPS, registry.Step("17", "doubling a number", bonus=True)))
    nav = [{"Home": "index.md"}, {"The course": [{"MAX for PyTorch users": "pytorch-to-max.md"}]}]
    course = book.on_config({"nav": nav})["nav"][1]["The course"]
    assert course[0] == {"Step 01": "steps/step-01.md"} and course[-2] == {"Bonus step 17": "steps/step-17.md"}
    assert course[-1] == {"MAX for PyTorch users": "pytorch-to-max.md"} and len(course) == 18
