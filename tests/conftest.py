"""Shared helpers for the test suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from model.device import hide_gpus

# The suite tests the CPU on every machine: the GPUs are hidden before MAX first looks for a
# device, from this process and every one it starts (why: docs/contributing.md). The GPU's own
# tests (tests/test_gpu.py) run with them in sight: `pixi run test-gpu` sets TEST_GPUS to 1.
TEST_GPUS = "GPT2_MAX_TEST_GPUS"
if os.environ.get(TEST_GPUS) != "1":
    hide_gpus()

from max.experimental.executor import set_default_executor  # noqa: E402  (after the GPUs are hidden)

from checker import __main__ as cli  # noqa: E402
from checker import eager_kernels, registry  # noqa: E402
from checker.harness import Outcome, run_checks  # noqa: E402
from checker.skeleton import ROOT, make_skeleton  # noqa: E402
from model.max_internals import build_kv_cache_ops, executor_without_background_compiles  # noqa: E402

SOLUTIONS = ROOT / "solutions"

# MAX's eager kernels shipped for this machine's CPU level, named for this process and every one it
# starts: where they serve, no test compiles an eager kernel, and CI needs no `warm` step.
eager_kernels.use()

# MAX's default eager executor compiles each new eager graph in background processes while it
# interprets it, for later calls; a test runs most of its eager graphs once, so on a cold run
# those compiles only took cores from the tests (docs/contributing.md). This process's eager
# work compiles only what the interpreter refuses. Its children keep MAX's default, as users
# have it (the checker's processes choose their own executor: checker/maxrun.py).
set_default_executor(executor_without_background_compiles())


# `pixi run test` runs the files on several workers (pytest-xdist, --dist loadfile: each
# file whole on one worker, in the order collected): a cold run is mostly MAX compiling
# graphs, and one compile keeps fewer than two cores busy (docs/contributing.md). A worker is
# handed the next file when it has two tests or fewer left, in this order (--no-loadscope-reorder
# keeps it; without it pytest-xdist orders the files by their number of tests). The slowest files
# go first, so that none of them starts last and runs alone: the first two compile the suite's two
# units of graphs (tests/suite_graphs.py), each on its own worker; then the files that compile a
# graph alone or start servers. The files that wait for the longer unit go last, so that they
# find it done instead of waiting for it.
SLOWEST_FIRST = ("test_fast_linear.py", "test_quantize.py", "test_app.py", "test_serve.py", "test_bench.py",
                 "test_shipped_app_graphs.py")
LAST = ("test_kv_cache.py", "test_model.py", "test_generate.py", "test_engine_threads.py", "test_saved_graphs.py",
        "test_attention_map.py")
GIB_PER_WORKER = 2.5  # a graph's compile peaks below 2 GB


def pytest_configure(config):
    """Before pytest-xdist starts its workers: MAX's Mojo module built first by this process (side
    by side on a fresh install they read it half written: model/max_internals.py's
    build_kv_cache_ops; a run in one process imports it alone and builds nothing here), and numpy's
    BLAS given the workers' share of the cores (each worker would start a thread per core, the
    workers together twice as many as the cores on two, where OpenBLAS's threads spin waiting for
    each other: a run's own setting is kept)."""
    workers = getattr(config.option, "numprocesses", None)
    if workers and "PYTEST_XDIST_WORKER" not in os.environ:
        build_kv_cache_ops()
        if isinstance(workers, int):
            os.environ.setdefault("OPENBLAS_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)} | {name: 1000 + i for i, name in enumerate(LAST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FIRST)))  # stable: each file's own order kept


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: none where it is not installed
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: a worker per core, as many as memory holds compiling at once."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(os.cpu_count() or 1, int(memory // GIB_PER_WORKER)))


def written_steps() -> list[str]:
    """Every step (each has its checks)."""
    return [step.number for step in registry.STEPS]


def solution_path(step: str) -> Path:
    return SOLUTIONS / f"solution_{step}.py"


def check_file(step: str, path: Path, stop_at_failure: bool = False) -> list[Outcome]:
    return run_checks(step, cli.checks_module(step).CHECKS, path, solution_path(step), stop_at_failure=stop_at_failure)


def mutate(step: str, tmp_path: Path, replacements: list[tuple[str, str]]) -> Path:
    """A copy of the solution with each ``old`` replaced by ``new`` (exactly once)."""
    text = solution_path(step).read_text()
    for old, new in replacements:
        assert text.count(old) == 1, f"seeded mistake does not apply: {old!r} occurs {text.count(old)} times"
        text = text.replace(old, new)
    path = tmp_path / f"mutant_{step}.py"
    path.write_text(text)
    return path


def skeleton_file(step: str, tmp_path: Path) -> Path:
    """The untouched skeleton, generated fresh (steps/ may hold a learner's work)."""
    path = tmp_path / f"skeleton_{step}.py"
    path.write_text(make_skeleton(solution_path(step).read_text(), step))
    return path


@pytest.fixture
def new_project_cache(tmp_path, monkeypatch) -> Path:
    """An empty project cache folder for one test (GPT2_MAX_CACHE, in this
    process), except that this project's kernel library is the one in the
    usual cache folder. MAX's compile cache keys a graph by its kernel
    library's path: a library rebuilt in a new folder made MAX compile the
    tiny checkpoint's graph again, where the usual path finds it compiled."""
    from model.layers import custom_op

    library = custom_op.kernel_library()  # built, or found, where every other run keeps it
    folder = tmp_path / "cache"
    monkeypatch.setenv("GPT2_MAX_CACHE", str(folder))
    monkeypatch.setattr(custom_op, "kernel_library", lambda: library)
    return folder


@pytest.fixture(params=written_steps())
def step(request) -> str:
    return request.param


def pythonpath(*first: str | Path) -> str:
    """A child's PYTHONPATH: ``first``, then this process's own entries (where the packages
    come from when they are not installed in the interpreter, as on a machine running the suite
    from an unpacked folder of them: the GPU kit)."""
    return os.pathsep.join([*map(str, first), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


def run_python(*args: str, timeout: int = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run this interpreter in a child process from the repository root
    (in ``env`` when given, else in this process's environment).

    The environment is passed explicitly: once MAX has run an eager op, its
    native runtime has set PYTHONEXECUTABLE and PYTHONPATH in the C-level
    environment (not in os.environ), and a child that inherits them no longer
    finds the virtual environment's packages."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ) if env is None else env,
    )


def warn_unrecorded(rows: list[dict], program: str) -> None:
    """A targets check's graph compiled here that its record (maintain/compiled_targets.json) lacks: right,
    but every later CI run compiles it too, so the run says so (pytest's warnings summary)."""
    import warnings

    unrecorded = [f"{r['target']} {r['dtype']} ({r['seconds']:.0f} s)" for r in rows if not r.get("recorded")]
    if unrecorded:
        warnings.warn(f"compiled, not in maintain/compiled_targets.json: {', '.join(unrecorded)}; "
                      f"`python -m {program} --ci --record` spares later CI runs these compiles", stacklevel=2)


@pytest.fixture
def suite_graphs_of_this_test(request):
    """The model graphs tests/suite_graphs.py lists for this test alone (``file::test``), compiled
    with their group's before it runs."""
    from suite_graphs import compile_for

    compile_for(f"{request.path.name}::{request.function.__name__}", collected_files(request))


@pytest.fixture(scope="module", autouse=True)
def suite_graphs(request):
    """The model graphs this file loads, compiled with its group's before its first test
    (tests/suite_graphs.py): one compile for several graphs."""
    from suite_graphs import compile_for

    compile_for(request.path.name, collected_files(request))


def collected_files(request) -> set[str]:
    """The names of the test files this run collected (a unit compiles only what they load)."""
    return {item.path.name for item in request.session.items}


@pytest.fixture(autouse=True)
def no_process_state_left_behind():
    """A test that sets model/cpu.py's process-wide as-shipped flag (what the server's engine
    does for good) must restore it: the tests after it in the same process would name and
    build graphs as for another CPU. And the processes a test starts name a copied solution's
    imports again: the steps package, imported once in this process by any test, marks them
    said for the processes started after (steps/__init__.py)."""
    from model import cpu

    # (not through monkeypatch: requesting it here would undo a test's own patches after the check below)
    os.environ.pop("GPT2_MAX_STEPS_IMPORTS_NAMED", None)
    before = cpu._as_shipped
    yield
    assert cpu._as_shipped == before, "this test left model.cpu's as-shipped flag set: monkeypatch it"
