"""The checker passes the solutions, fails the skeletons, and reports readably."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from conftest import check_file, run_python, skeleton_file, solution_path


def test_every_check_passes_on_the_solution(step):
    outcomes = check_file(step, solution_path(step))
    failed = [(o.name, o.message) for o in outcomes if not o.passed]
    assert outcomes and not failed


def test_untouched_skeleton_fails_with_a_todo_hint(step, tmp_path):
    outcomes = check_file(step, skeleton_file(step, tmp_path))
    failed = [o for o in outcomes if not o.passed]
    assert failed, "the untouched skeleton passed every check"
    assert any("still a TODO" in o.message for o in failed)
    assert all(o.hint for o in failed)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_python("-m", "checker", *args, "--no-color")


def test_cli_exit_codes_and_hint(tmp_path):
    done = _cli("01", "--solution")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout and "FAIL" not in done.stdout

    failed = _cli("01", "--file", str(skeleton_file("01", tmp_path)))
    assert failed.returncode == 1
    assert "FAIL" in failed.stdout
    assert failed.stdout.count("hint:") == 1  # a hint for the first failure only
    assert "skeleton_01.py:" in failed.stdout  # the learner's line, not MAX internals
    assert "Traceback" not in failed.stdout + failed.stderr


def test_learner_exception_points_at_the_learners_line(tmp_path):
    path = tmp_path / "broken_01.py"
    text = solution_path("01").read_text().replace(
        "return self.n_embd // self.n_head", "return self.n_embd // self.num_heads"
    )
    path.write_text(text)
    outcomes = check_file("01", path)
    failure = next(o for o in outcomes if not o.passed)
    assert "broken_01.py:" in failure.message and "AttributeError" in failure.message
    assert "num_heads" in failure.message


def test_syntax_error_is_reported_with_its_line(tmp_path):
    path = tmp_path / "syntax_01.py"
    path.write_text(solution_path("01").read_text().replace("def head_dim(self)", "def head_dim(self"))
    [outcome] = check_file("01", path)
    assert not outcome.passed and "SyntaxError" in outcome.message and "syntax_01.py:" in outcome.message


def test_returning_none_is_named(tmp_path):
    path = tmp_path / "none_02.py"
    path.write_text(solution_path("02").read_text().replace("return F.where(hidden, minus_inf, zero)",
                                                             "F.where(hidden, minus_inf, zero)"))
    outcomes = check_file("02", path)
    failure = next(o for o in outcomes if not o.passed)
    assert "returned None" in failure.message and "return" in failure.hint


def test_unknown_step_and_missing_file():
    assert _cli("17").returncode == 2
    missing = _cli("01", "--file", "/nonexistent/step.py")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_the_compile_note_speaks_only_when_this_run_compiled_for_more_than_a_second(monkeypatch):
    # A learner's first hour: "MAX's kernel cache on this machine is cold ..." printed on the
    # 10th run at 2-3 s; MAX's "compiled ... on the fly" line on every run.
    from checker import maxrun

    monkeypatch.setattr(maxrun, "COMPILED", [])
    assert maxrun.collect_compiles()
    from model.max_internals import eager_policy

    policy = eager_policy()
    policy.record_cold_compile("data_movement_TransposeOp_cpu_0_uint32", 0.04, provisioned=False)
    assert maxrun.compile_note() is None  # a warm run: nothing to say
    policy.record_cold_compile("mo.matmul_cpu_float32", 31.5, provisioned=False)
    note = maxrun.compile_note()
    assert "compiled 2 of MAX's kernels (32 s; the longest mo.matmul_cpu_float32, 32 s)" in note and "warm" in note
    assert maxrun.compile_note(since=2) is None  # a later step of the same run compiled nothing


def test_a_long_wait_is_announced_only_while_max_compiles(monkeypatch):
    # A first `show 07` or step 12 check sat silent for minutes; and on a warm machine a 7 s
    # check printed "the first run on this machine compiles MAX's kernels" on time alone.
    import io
    import time

    from checker import maxrun
    from model.max_internals import eager_policy

    monkeypatch.setattr(maxrun, "COMPILED", [])
    monkeypatch.setitem(maxrun.COMPILING, "since", None)
    assert maxrun.collect_compiles()
    policy = eager_policy()
    out = io.StringIO()
    with maxrun.slow_notice("step 12's checks", after=0.05, out=out):
        pass  # warm and quick: done before the notice is due
    with maxrun.slow_notice("step 11's checks", after=0.05, every=0.1, out=out):
        time.sleep(0.3)  # warm and slow: MAX compiled nothing
    assert out.getvalue() == ""
    with maxrun.slow_notice("step 12's checks", after=0.05, every=0.1, out=out):
        assert policy.allow_lazy_compile()  # what MAX asks right before it compiles a kernel
        time.sleep(0.32)
        policy.record_cold_compile("mo.matmul_cpu_float32", 0.3, provisioned=False)
    time.sleep(0.15)  # nothing after it ends
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("  ... still running after 0 s (step 12's checks): the first run on this machine")
    assert 2 <= len(lines) <= 4 and all("still compiling (step 12's checks)" in line for line in lines[1:])
    assert maxrun.COMPILED == [("mo.matmul_cpu_float32", 0.3)] and maxrun.COMPILING["since"] is None


def test_test_all_gives_an_untouched_bonus_step_one_line(monkeypatch, capsys):
    # After 12 of 12, test-all printed ~50 lines of failures for bonus steps nobody had begun.
    from checker import __main__ as cli
    from checker import registry

    ran = []
    monkeypatch.setattr(cli, "check_step", lambda step, *args, **kwargs: ran.append(step) or True)
    monkeypatch.setattr(cli, "untouched", lambda step: True)  # as in a fresh clone, whatever this one's steps/ hold
    assert cli.check_all(color=False, solution=False) == 0
    out = capsys.readouterr().out
    bonus = [s for s in registry.STEPS if s.bonus]
    assert ran == [s.number for s in registry.STEPS if not s.bonus]
    for step in bonus:
        assert f"Bonus step {step.number}: {step.title}: not started (optional; " in out
    assert f"of {len(bonus)} bonus steps." in out
    ran.clear()
    cli.check_all(color=False, solution=True)  # the solutions: every step runs
    assert ran == [s.number for s in registry.STEPS]


def test_the_checker_s_processes_hide_the_gpus_from_max():
    """`python -m checker` and `python -m checker.show` run the learner's code
    on the CPU: their processes hide the GPUs before MAX looks for devices, so that
    on a GPU machine the shipped CPU kernels serve and nothing compiles for
    the GPU. Run as the learner runs them (the modules' __main__ blocks)."""
    probe = """
import os, runpy, sys
sys.argv = {argv!r}
try:
    runpy.run_module({module!r}, run_name="__main__")
except SystemExit:
    pass
print("hidden:", [os.environ.get(name) for name in {names!r}])
"""
    from model.device import GPU_VISIBILITY

    # (the suite's own processes have them hidden already: each child starts with a GPU named)
    env = {k: v for k, v in os.environ.items() if k not in GPU_VISIBILITY}
    for module, argv in (("checker", ["checker", "01", "--solution", "--no-color"]), ("checker.show", ["show", "99"])):
        done = run_python("-c", probe.format(argv=argv, module=module, names=GPU_VISIBILITY), timeout=300,
                          env=dict(env, CUDA_VISIBLE_DEVICES="0"))
        last = done.stdout.strip().splitlines()[-1]
        assert last.startswith(f"hidden: {[''] * len(GPU_VISIBILITY)}"), (module, done.stdout, done.stderr[-2000:])
    # GPT2_MAX_CHECKER_GPUS=1: left as the user set them
    done = run_python("-c", probe.format(argv=["show", "99"], module="checker.show", names=GPU_VISIBILITY),
                      timeout=300, env=dict(env, GPT2_MAX_CHECKER_GPUS="1", CUDA_VISIBLE_DEVICES="0"))
    assert done.stdout.strip().splitlines()[-1] == "hidden: ['0', None, None]", done.stdout


def test_a_folder_is_not_a_step_file(tmp_path):
    done = _cli("01", "--file", str(tmp_path))
    assert done.returncode == 2 and done.stderr.strip() == f"error: {tmp_path} is a folder, not a Python file"


def _step_01_with(tmp_path, name: str, code: str, where: str = "body"):
    """Step 01's solution with ``code`` run at import (``where="import"``) or where head_dim is computed."""
    text = solution_path("01").read_text()
    if where == "import":
        text += f"\n{code}\n"
    else:
        text = text.replace("return self.n_embd // self.n_head", f"{code}\n        return self.n_embd // self.n_head")
    path = tmp_path / f"{name}_01.py"
    path.write_text(text)
    return path


@pytest.mark.parametrize("code, said", [("import sys; sys.exit(0)", "SystemExit(0)"),
                                        ("raise SystemExit(3)", "SystemExit(3)")])
@pytest.mark.parametrize("where", ["import", "body"])
def test_code_that_ends_the_program_fails_its_check(tmp_path, code, said, where):
    done = _cli("01", "--file", str(_step_01_with(tmp_path, "exits", code, where)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL" in done.stdout and f"your code ended the program ({said})" in done.stdout
    assert "checks passed" in done.stdout and "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("where", ["import", "body"])
def test_a_check_past_its_time_limit_fails_saying_so(tmp_path, where):
    path = _step_01_with(tmp_path, "loops", "while True:\n            pass" if where == "body" else "while True: pass",
                         where)
    started = time.monotonic()
    done = _cli("01", "--file", str(path), "--time-limit", "2")
    assert done.returncode == 1 and time.monotonic() - started < 60, done.stdout + done.stderr
    assert "did not finish within 2 s, the time limit of each check" in done.stdout
    assert "loops_01.py:" in done.stdout and "--time-limit" in done.stdout
