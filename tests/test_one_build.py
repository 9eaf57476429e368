"""The app has one model build: ``model.gpt2.load_gpt2``. Read from the
source, so that a second build path (another compile, a tree patched after
construction, a string-built import of the course) fails here by name.

The server (serve/) is the one other place a network is built, because MAX's
serving engine owns that build: it constructs the module where it asks
(``GPT2PipelineModel._instantiate_module``) and compiles it itself. serve/
never compiles and never builds the course's GPT2LMHeadModel."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = sorted((ROOT / "model").glob("*.py")) + sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "serve").glob("*.py"))
BUILD = ROOT / "model" / "gpt2.py"


def calls(path: Path) -> list[tuple[str, int]]:
    """(dotted name of the called function, line) for every call in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            out.append((ast.unparse(node.func), node.lineno))
    return out


@pytest.mark.parametrize("path", APP, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_second_build(path):
    rel = path.relative_to(ROOT)
    for name, line in calls(path):
        assert name not in ("setattr", "importlib.import_module", "__import__"), f"{rel}:{line}: {name}()"
        if path != BUILD:
            # (re.compile builds a regular expression, not a graph)
            assert not name.endswith(".compile") or name == "re.compile", f"{rel}:{line}: compiles a graph outside model/gpt2.py"
            assert not name.endswith("GPT2LMHeadModel"), f"{rel}:{line}: builds a model outside model/gpt2.py"
            assert name not in ("build_lm", "InPlaceGraph", "ConcatGraph", "_compile"), f"{rel}:{line}: {name}() outside the build"


def test_the_course_is_reached_by_plain_imports():
    # model/course.py names both implementations in import statements, so
    # import readers (and farm-studio) see model -> solutions and model -> steps.
    source = (ROOT / "model" / "course.py").read_text()
    assert re.search(r"^\s+from solutions\.solution_11 import GPT2LMHeadModel$", source, re.M)
    assert re.search(r"^\s+from steps\.step_11 import GPT2LMHeadModel$", source, re.M)


def test_head_dim_is_defined_once():
    # The config's property (step 01); everything else reads config.head_dim.
    found = [f"{p.relative_to(ROOT)}" for p in APP + sorted((ROOT / "solutions").glob("*.py"))
             if re.search(r"n_embd\s*//\s*(self\.|config\.)?n_head", p.read_text())]
    assert found == ["solutions/solution_01.py"]
