"""The app has one model build: ``model.gpt2.load_gpt2`` (its graph made by
model/graph.py; model/together.py compiles several such builds as one unit,
for a caller that needs them at once). Read from the source, so that a second build path (another
compile, a tree patched after construction, a string-built import of the
course) fails here by name; and the package's shape: one place
defines each build option, each cache path, each Linear class.

The server (serve/) is the one other place a network is built, because MAX's
serving engine owns that build: it constructs the module where it asks
(``GPT2PipelineModel._instantiate_module``) and compiles it itself. serve/
never compiles a graph it runs (serve/targets.py compiles the engine's graph
for hardware that is not here, and never runs it); it builds the course's
GPT2LMHeadModel in one place, serve/network.py, and hands its attention the
paged cache."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = (sorted((ROOT / "model").rglob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
       + sorted((ROOT / "serve").glob("*.py")))
BUILD = (ROOT / "model" / "gpt2.py", ROOT / "model" / "graph.py", ROOT / "model" / "together.py")
SERVED_TARGETS = ROOT / "serve" / "targets.py"  # the engine's graph compiled for other hardware, never run
SERVED_NETWORK = ROOT / "serve" / "network.py"  # the engine's build: the course's model with the paged cache
# Times a step with course blocks left out: it sets their methods to pass their input through,
# builds through load_gpt2 and sets them back; no tree is patched after construction.
LEFT_OUT_PROFILE = ROOT / "bench" / "profile_decode.py"


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
        assert name not in ("importlib.import_module", "__import__"), f"{rel}:{line}: {name}()"
        assert name != "setattr" or path == LEFT_OUT_PROFILE, f"{rel}:{line}: {name}()"
        if path not in BUILD:
            # (re.compile builds a regular expression, not a graph)
            assert not name.endswith(".compile") or name == "re.compile" or path == SERVED_TARGETS, (
                f"{rel}:{line}: compiles a graph outside the build")
            if path != SERVED_NETWORK:
                assert not name.endswith("GPT2LMHeadModel"), f"{rel}:{line}: builds a model outside the build"
            assert name not in ("build_lm", "InPlaceGraph", "ConcatGraph", "compile_graph", "wrap"), (
                f"{rel}:{line}: {name}() outside the build")


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


PACKAGE = sorted(p for folder in ("model", "bench", "serve", "weights", "checker", "offline", "maintain", "artifacts")
                 for p in (ROOT / folder).rglob("*.py"))


def definitions(path: Path):
    """(name, kind, the function it is defined inside or None) for every def and class in ``path``."""
    out = []

    def visit(node, inside):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.append((child.name, type(child).__name__, inside))
                visit(child, child.name if not isinstance(child, ast.ClassDef) else inside)
            else:
                visit(child, inside)

    visit(ast.parse(path.read_text()), None)
    return out


def test_each_build_option_is_defined_once():
    where = {name: [] for name in ("uses_kernels", "LINEARS", "CACHES", "IMPLS")}
    for path in PACKAGE:
        rel = path.relative_to(ROOT).as_posix()
        for name, _, _ in definitions(path):
            if name in where:
                where[name].append(rel)
        for name in re.findall(r"^(LINEARS|CACHES|IMPLS) = ", path.read_text(), re.M):
            where[name].append(rel)
    assert where == {"uses_kernels": ["model/options.py"], "LINEARS": ["model/options.py"],
                     "CACHES": ["model/options.py"], "IMPLS": ["model/course.py"]}


def test_layer_classes_live_at_module_level():
    # Importable, named in tracebacks, readable on their own: no Linear class made inside a function.
    inside = [f"{p.relative_to(ROOT)}: {name} in {fn}()" for p in PACKAGE for name, kind, fn in definitions(p)
              if kind == "ClassDef" and fn is not None and name.endswith("Linear")]
    assert inside == []


def test_no_class_is_made_inside_a_function_in_the_app_or_the_server():
    # A class made by a function (a subclass of the course's attention, say) is a copy of
    # the course's code in disguise; the app and the server hand the course's own classes
    # their cache objects instead.
    inside = [f"{p.relative_to(ROOT)}: {name} in {fn}()" for p in PACKAGE for name, kind, fn in definitions(p)
              if kind == "ClassDef" and fn is not None and p.relative_to(ROOT).parts[0] in ("model", "serve")]
    assert inside == []


def test_only_the_course_writes_an_attention_forward():
    # A function that calls both c_attn and c_proj is an attention forward: it lives in
    # step 07 (and its bonus variants), so a learner's change to it reaches the app and the server.
    found = []
    for path in PACKAGE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                if {"c_attn", "c_proj"} <= names:
                    found.append(f"{path.relative_to(ROOT)}: {node.name}()")
    assert found == []


def test_cache_paths_live_in_the_cache_module():
    # The cache folder, its environment variables and ~ are named in model/caches.py only.
    # offline/ aside: it runs on a machine before MAX and numpy are there (standard library
    # only), and its folder there holds the dependencies it brings, not a cache.
    pattern = re.compile(r"gpt2-on-max|GPT2_MAX_CACHE|Path\.home\(\)|def cache_root")
    found = [p.relative_to(ROOT).as_posix() for p in PACKAGE
             if pattern.search(p.read_text()) and not p.is_relative_to(ROOT / "offline")]
    assert found == ["model/caches.py"]


def imports(path: Path) -> set[str]:
    """The project modules ``path`` imports, at any depth of its code."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# The layers, top to bottom: a package imports only from its own layer or below.
# maintain/: the maintainers' tools (they make what the app, the server and the checker use); artifacts/: the
# compiled-artifact mechanism, which knows no model.
LAYERS = [{"maintain"}, {"bench", "checker", "offline"}, {"serve"}, {"model"}, {"solutions", "steps", "weights"},
          {"artifacts"}, {"tasks"}]


def test_imports_point_down_and_never_in_a_circle():
    modules = {module_name(p): p for p in [*PACKAGE, *(ROOT / "solutions").glob("*.py"), ROOT / "tasks.py"]}
    level = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
    edges = {m: {i for i in imports(p) if i in modules and i != m} for m, p in modules.items()}
    upward = [f"{m} -> {i}" for m, targets in edges.items() for i in targets
              if level[i.split(".")[0]] < level[m.split(".")[0]]]
    assert upward == []
    # No circle among modules (a package's __init__ importing its own submodules aside).
    state: dict[str, int] = {}

    def circle_from(m, trail):
        state[m] = 1
        for i in sorted(edges[m]):
            if m.startswith(i + ".") or i.startswith(m + "."):
                continue
            if state.get(i) == 1:
                return trail + [i]
            if i not in state and (found := circle_from(i, trail + [i])):
                return found
        state[m] = 2
        return None

    for m in sorted(modules):
        if m not in state:
            assert circle_from(m, [m]) is None
