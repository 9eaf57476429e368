"""bench/compiles.py and its hooks (bench/compile_log): each compile logged
once, in every process, and put down to the test that caused it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import pythonpath

from bench import compiles


def hook_module(log):
    spec = importlib.util.spec_from_file_location("compile_log_hook", compiles.HOOKS / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # without GPT2_MAX_COMPILE_LOG: nothing patched on import
    module.LOG = str(log)
    return module


def test_a_load_that_compiles_is_logged_once_and_errors_pass_through(tmp_path):
    hook = hook_module(tmp_path / "log.jsonl")

    class Session:
        def compile(self, model):
            return "compiled"

        def load(self, model):
            if model == "bad":
                raise ValueError("no such graph")
            return self.compile(model)

    hook._wrap(Session, "compile")
    hook._wrap(Session, "load")
    assert Session().load("model") == "compiled"
    with pytest.raises(ValueError, match="no such graph"):
        Session().load("bad")
    rows = compiles.read(tmp_path / "log.jsonl")
    assert [(r["method"], r["what"]) for r in rows] == [("load", "file model"), ("load", "file bad")]


def test_every_process_started_with_the_hooks_has_max_s_session_patched(tmp_path):
    env = dict(os.environ, PYTHONPATH=pythonpath(compiles.HOOKS), GPT2_MAX_COMPILE_LOG=str(tmp_path / "log.jsonl"))
    code = "from max.engine.api import InferenceSession as S; print(S.compile.__qualname__, S.load.__qualname__)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["_wrap.<locals>.timed"] * 2, done.stderr[-2000:]
    env.pop("GPT2_MAX_COMPILE_LOG")  # without a log named, MAX is left alone
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "timed" not in done.stdout, done.stderr[-2000:]


def test_a_compile_in_a_process_that_outlived_its_test_goes_to_the_test_running_then(tmp_path):
    log = tmp_path / "log.jsonl"
    tests = [{"test": "tests/test_a.py::test_one", "worker": "gw1", "start": 100.0, "end": 200.0},
             {"test": "tests/test_b.py::test_two", "worker": "gw1", "start": 200.0, "end": 400.0},
             {"test": "tests/test_c.py::test_three", "worker": "gw0", "start": 100.0, "end": 400.0}]
    rows = [  # the compile pool of gw1 still carries test_one's name at 250 s
        {"method": "compile", "what": "eager: mo.add", "start": 150.0, "s": 30.0, "worker": "gw1",
         "test": "tests/test_a.py::test_one (call)", "argv": ["-c"]},
        {"method": "compile", "what": "eager: mo.mul", "start": 250.0, "s": 40.0, "worker": "gw1",
         "test": "tests/test_a.py::test_one (call)", "argv": ["-c"]},
        {"method": "load", "what": "gpt2", "start": 120.0, "s": 90.0, "worker": "gw0",
         "test": "tests/test_c.py::test_three (setup)", "argv": ["/x/model/targets.py", "--one", "sm_90a"]},
        {"method": "load", "what": "file binary_cpu.mef", "start": 300.0, "s": 0.02, "worker": "gw1",
         "test": "tests/test_b.py::test_two (call)", "argv": ["-c"]}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "log.jsonl.tests").write_text("".join(json.dumps(t) + "\n" for t in tests))
    text = compiles.report(log, longest=3)
    assert text.startswith("3 compiles of 1 s or more, 160 s in all (1 shorter")
    assert "| tests/test_c.py | 90 | 1 |" in text and "| tests/test_b.py | 40 | 1 |" in text
    assert "| tests/test_a.py | 30 | 1 |" in text
    assert "| 90 | gpt2 | tests/test_c.py::test_three | targets.py --one sm_90a |" in text
    assert "| 40 | eager: mo.mul | tests/test_b.py::test_two |  |" in text


def test_the_report_ends_with_each_worker_s_files_in_order(tmp_path):
    log = tmp_path / "log.jsonl"
    tests = [{"test": "tests/test_a.py::test_one", "worker": "gw0", "start": 100.0, "end": 150.0},
             {"test": "tests/test_a.py::test_two", "worker": "gw0", "start": 150.0, "end": 300.0},
             {"test": "tests/test_b.py::test_three", "worker": "gw0", "start": 300.0, "end": 310.0},
             {"test": "tests/test_c.py::test_four", "worker": "gw1", "start": 101.0, "end": 400.0}]
    rows = [{"method": "compile", "what": "gpt2", "start": 160.0, "s": 120.0, "worker": "gw0",
             "test": "tests/test_a.py::test_two (call)", "argv": ["-c"]}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "log.jsonl.tests").write_text("".join(json.dumps(t) + "\n" for t in tests))
    text = compiles.report(log)
    assert text.split("each worker's files, in order:")[1].split("\n")[4:] == [
        "| gw0 | 0 | tests/test_a.py | 200 | 120 |", "| gw0 | 200 | tests/test_b.py | 10 | 0 |",
        "| gw0 | 210 | (its last test ended) | | |",
        "| gw1 | 1 | tests/test_c.py | 299 | 0 |", "| gw1 | 300 | (its last test ended) | | |"]
