"""pixi.toml is real: it parses, names Python 3.13 and the project's dependencies,
has every task, and every task's command runs in the pip environment (tasks.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from conftest import run_python

from checker import registry
from checker.skeleton import ROOT

PIXI = tomllib.loads((ROOT / "pixi.toml").read_text())
TASKS = PIXI["tasks"]


def tasks_py(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return run_python(str(ROOT / "tasks.py"), *args, timeout=timeout)


def test_pixi_manifest_shape():
    assert PIXI["dependencies"]["python"] == "3.13.*"
    assert (ROOT / ".python-version").read_text().strip() == "3.13"
    project = PIXI["pypi-dependencies"]["gpt2-on-max"]
    assert project["path"] == "." and "test" in project["extras"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "gpt2-on-max"
    assert all("==" in dep for dep in pyproject["project"]["dependencies"]), "pin every dependency"


def test_every_step_has_a_task_and_the_suite_too():
    for step in registry.STEPS:  # and their descriptions: tests/test_registry.py
        assert TASKS[step.task]["cmd"] == f"python -m checker {step.number}"
    for name in ("test", "test-all", "warm", "skeletons", "generate", "bench"):
        assert name in TASKS
    assert TASKS["test-all"]["cmd"] == "python -m checker all"  # (test_other_tasks_run_through_tasks_py: its --help)
    assert all(spec.get("description") for spec in TASKS.values())


def test_readme_test_command_is_the_test_task_and_ci_runs_it():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pixi run test" in readme and "python3.13 tasks.py test" in readme
    assert "tasks.py test" in ci


def test_tasks_py_lists_tasks_from_pixi():
    listed = tasks_py("--list")
    assert listed.returncode == 0
    for name in TASKS:
        assert f"  {name} " in listed.stdout


def test_tasks_py_rejects_unknown_task():
    done = tasks_py("nope")
    assert done.returncode == 2 and "no task 'nope'" in done.stderr


@pytest.mark.skipif(sys.version_info[:2] != (3, 13), reason="tasks.py runs its tasks under Python 3.13 only")
def test_step_tasks_run_through_tasks_py():
    # s01 checks steps/step_01.py: it either passes (a learner finished it) or
    # fails with the checker's report; both mean the command ran.
    done = tasks_py("s01", "--no-color")
    assert done.returncode in (0, 1), done.stderr
    assert "Step 01:" in done.stdout and "checks passed" in done.stdout


@pytest.mark.skipif(sys.version_info[:2] != (3, 13), reason="tasks.py runs its tasks under Python 3.13 only")
def test_other_tasks_run_through_tasks_py():
    assert tasks_py("skeletons", "--check").returncode == 0
    warm = tasks_py("warm", "--check")  # asks MAX whether it is warm; compiles nothing
    assert warm.returncode in (0, 1) and "provisioned" in warm.stdout
    suite = tasks_py("test", "--collect-only", "-q", "tests/test_skeletons.py")
    assert suite.returncode == 0 and "test_regions_become_placeholders" in suite.stdout
    bench = tasks_py("bench", "--help")
    assert bench.returncode == 0 and "--hf-python" in bench.stdout
    generate = tasks_py("generate", "--help")
    assert generate.returncode == 0 and "--max-new-tokens" in generate.stdout
    amap = tasks_py("attention-map", "--help")
    assert amap.returncode == 0 and "--head" in amap.stdout
    # (the checks themselves, all of them in one run: test_eager_kernels.py's first checks on empty caches)
    every = tasks_py("test-all", "--help")
    assert every.returncode == 0 and "'all'" in every.stdout and "--solution" in every.stdout


def test_messages_name_commands_the_way_the_learner_runs_tasks(monkeypatch):
    # Messages once said `pixi run s01` to a learner without pixi.
    import tasks

    monkeypatch.setenv(tasks.RUNNER, "python3.13 tasks.py")  # what tasks.py puts in its tasks' environment
    assert tasks.task_command("s01") == "python3.13 tasks.py s01"
    monkeypatch.delenv(tasks.RUNNER)
    monkeypatch.setenv("PIXI_PROJECT_ROOT", "/x")  # pixi runs the task
    assert tasks.task_command("warm") == "pixi run warm"
    monkeypatch.delenv("PIXI_PROJECT_ROOT")
    monkeypatch.setattr(tasks.shutil, "which", lambda name: None)  # run by hand, no pixi on this machine
    assert tasks.task_command("s07") == "python3.13 tasks.py s07"


def test_the_first_install_prints_a_few_lines_not_pip_s_stream(tmp_path, monkeypatch, capsys):
    # The first `tasks.py s01` once buried its output under dozens of pip WARNING lines.
    import subprocess

    import pytest

    import tasks

    monkeypatch.setattr(tasks, "VENV", tmp_path / "venv")
    monkeypatch.setattr(tasks, "STAMP", tmp_path / "venv" / ".installed-from")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    noise = "WARNING: Location 'file:///x/simple/mdurl/' is ignored\n" * 40

    def pip(args, **kwargs):
        return subprocess.CompletedProcess(args, returncode=pip.code, stdout="", stderr=noise)

    monkeypatch.setattr(tasks.subprocess, "run", pip)
    pip.code = 0
    tasks.ensure_venv()
    err = capsys.readouterr().err
    assert "WARNING" not in err and len(err.splitlines()) == 2 and "dependencies installed in" in err
    tasks.STAMP.unlink()
    pip.code = 1
    with pytest.raises(SystemExit, match="pip exit 1"):
        tasks.ensure_venv()
    assert "WARNING: Location" in capsys.readouterr().err  # a failure shows what pip said


def test_a_task_s_env_table_reaches_its_command(monkeypatch):
    # `test-gpu` shows the GPUs to the GPU's tests, which the suite hides (tests/conftest.py).
    from conftest import TEST_GPUS

    import tasks

    ran = {}

    def run(command, **kwargs):
        ran.update(command=command, env=kwargs["env"])
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(tasks, "ensure_venv", lambda: None)
    monkeypatch.setattr(tasks.subprocess, "run", run)
    monkeypatch.setattr(tasks.sys, "version_info", (3, 13, 0))
    monkeypatch.delenv(TEST_GPUS, raising=False)
    assert tasks.task_env("test-gpu") == {TEST_GPUS: "1"} and tasks.task_env("test") == {}
    assert tasks.main(["test-gpu", "-x"]) == 0
    assert ran["env"][TEST_GPUS] == "1" and ran["command"].endswith("tests/test_device.py -x")
    assert tasks.main(["test"]) == 0 and TEST_GPUS not in ran["env"]
