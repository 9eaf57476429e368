"""model/targets.py: the app's graph compiled, never run, for hardware that
is not here: an NVIDIA GPU (sm_90a), and the x86-64 kernel path this CPU
does not run (AVX2, or AVX-512 + VNNI), each through MAX's virtual targets
in a process of its own: `python -m maintain.targets --ci`."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import run_python, warn_unrecorded

from maintain import targets
from model.device import DTYPES


def compile_plan(tmp_path, *args) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "targets.json"
    done = run_python("-m", "maintain.targets", *args, "--json", str(out), timeout=3600)
    return done, json.loads(out.read_text()) if out.is_file() else []


def test_the_ci_targets_compile(tmp_path):
    """The demo for an H100/H200 in float32 (the GPU default; bfloat16 too under a MAX not known
    to compute it wrong: model/device.py refuses it under 26.7), and for the x86-64 kernel path
    this CPU does not run (AVX2-only or AVX-512 + VNNI) in float32 and q4_0: compiled, on any
    machine, now or (the same graph, kernels and MAX) as the record says."""
    done, rows = compile_plan(tmp_path, "--ci")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    plan = targets.ci_plan()
    assert {(r["target"], r["dtype"]) for r in rows} == {(t, d) for t, ds in plan.items() for d in ds}
    assert plan["sm_90a"] == targets.GPU_DTYPES and ({"x86-64-v3", "x86-64-v4-vnni"} & set(plan))
    assert all(r["compiled"] for r in rows)
    assert f"{len(rows)} of {len(rows)} compiled" in done.stdout
    warn_unrecorded(rows, "maintain.targets")


class Traced:
    """A traced graph as the check digests it (its printed body)."""

    def __init__(self, body: str) -> None:
        self.body = body

    def __repr__(self) -> str:
        return self.body


def test_a_gpu_compiles_the_precisions_a_build_accepts_there():
    """bfloat16 on a GPU only under a MAX release the app lets it through under (model/device.py)."""
    from model.device import bfloat16_fault

    assert targets.GPU_DTYPES == (("float32",) if bfloat16_fault() else ("float32", "bfloat16"))
    assert targets.ci_plan()["sm_90a"] == targets.GPU_DTYPES


def test_a_recorded_graph_is_not_compiled_again_and_any_change_compiles(tmp_path, monkeypatch):
    """A row compiled and recorded is found again by its traced graph, this project's kernels, MAX's
    version and the target: not compiled, and said so. Another graph, kernels, MAX or target, or
    --again, compiles; a failed compile is not recorded. (A stand-in check: no virtual mode here.)"""
    monkeypatch.setattr(targets, "RECORD", tmp_path / "compiled.json")
    built, body = [], {"now": "graph 1"}

    def build(folder, target, dtype):
        built.append((target.gpu, body["now"]))
        if body["now"] == "refused":
            raise RuntimeError("error: no kernel for this target")
        return ""

    check = targets.Check("maintain.targets", "a graph", ("float32",), ("float32",), build,
                          lambda folder, target, dtype: Traced(body["now"]), targets.ci_plan)

    def row(name="sm_90a", again=False):
        return targets.target_row(check, name, "float32", "demo", tmp_path, again)

    first = row()
    assert first["compiled"] and not first.get("recorded") and len(built) == 1
    assert targets.write_record(check.program, [first]) == 1
    second = row()
    assert second["compiled"] and second["recorded"] and len(built) == 1 and "compiled on" in second["detail"]
    assert targets.write_record(check.program, [second]) == 0  # nothing compiled: nothing added
    assert not row(again=True).get("recorded") and len(built) == 2
    assert not row("sm_80").get("recorded") and len(built) == 3
    body["now"] = "graph 2"
    assert not row().get("recorded") and len(built) == 4
    body["now"] = "graph 1"
    monkeypatch.setattr("model.graph_source.kernels_digest", lambda: "other kernels")
    assert not row().get("recorded") and len(built) == 5
    monkeypatch.undo()
    monkeypatch.setattr(targets, "RECORD", tmp_path / "compiled.json")
    monkeypatch.setattr(targets, "WEIGHT_SOURCES", ("README.md",))  # other code making the weights
    assert not row().get("recorded") and len(built) == 6
    monkeypatch.undo()
    monkeypatch.setattr(targets, "RECORD", tmp_path / "compiled.json")
    record = json.loads(targets.RECORD.read_text())
    [key] = record
    targets.RECORD.write_text(json.dumps({key: {**record[key], "max": "0.0"}}))
    assert not row().get("recorded") and len(built) == 7
    body["now"] = "refused"
    failed = row()
    assert not failed["compiled"] and "no kernel for this target" in failed["detail"]
    assert targets.write_record(check.program, [failed]) == 0


def test_the_record_names_what_each_graph_was_compiled_with():
    """maintain/compiled_targets.json: written by --record alone; every entry a target this check knows,
    with the digests and version a later run compares; what CI compiles on any machine, for the app and
    the server, in it; every file pattern of the code that makes the weights still names a file."""
    from maintain.server_targets import SERVED

    record = json.loads(targets.RECORD.read_text())
    for key, entry in record.items():
        program, name, dtype, model = key.split(" ")
        assert program in ("maintain.targets", "maintain.server_targets"), key
        assert name in targets.TARGETS and dtype in DTYPES, key
        assert entry["arch"] == (targets.TARGETS[name].gpu or targets.TARGETS[name].cpu), key
        assert {"graph", "kernels", "weights", "max", "compiled", "seconds"} <= set(entry), key
    for check in (targets.APP, SERVED):
        every_host = check.ci_plan(every_host=True)
        assert {(t, d) for t, ds in every_host.items() for d in ds} <= {
            tuple(k.split(" ")[1:3]) for k in record if k.startswith(check.program + " ")}, \
            f"python -m {check.program} --ci --record"
    assert all(list(targets.ROOT.glob(pattern)) for pattern in targets.WEIGHT_SOURCES)


def test_a_target_that_fails_is_named_with_its_first_error_line(tmp_path):
    """Quantized weights on a GPU are refused before any compile: each row
    says why, one failure does not stop the next row, and the run fails.
    Two processes at a time: the rows come back in the order asked."""
    done, rows = compile_plan(tmp_path, "sm_90a", "sm_80", "--dtypes", "q8_0", "q4_0", "--jobs", "2")
    assert done.returncode == 1
    assert [(r["target"], r["dtype"], r["compiled"]) for r in rows] == [
        ("sm_90a", "q8_0", False), ("sm_90a", "q4_0", False), ("sm_80", "q8_0", False), ("sm_80", "q4_0", False)]
    assert all("runs on the CPU only" in r["detail"] for r in rows)
    assert done.stdout.count("FAILED") == 4 and "0 of 4 compiled" in done.stdout


def test_a_target_past_its_time_fails_its_rows_and_says_so(tmp_path):
    done, rows = compile_plan(tmp_path, "x86-64-v3", "--dtypes", "float32", "q4_0", "--timeout", "0.5")
    assert done.returncode == 1
    assert [(r["dtype"], r["compiled"]) for r in rows] == [("float32", False), ("q4_0", False)]
    assert all("stopped after 0.5 s" in r["detail"] for r in rows)


def test_every_target_is_described_in_the_help():
    help_text = run_python("-m", "maintain.targets", "--help", timeout=120).stdout
    assert all(name in help_text and t.means in help_text for name, t in targets.TARGETS.items())


def test_targets_compiled_side_by_side_come_back_in_the_plan_s_order(monkeypatch, capsys):
    """A process per target, and per precision for a GPU target (its
    precisions share no compiled kernel; a CPU target's share many, so they
    compile one after the other in one process); the rows in the plan's
    order whatever order they finish in."""
    import time

    started = []

    def compile_target(name, dtypes, model, timeout, program, again=False):
        started.append((name, dtypes))
        time.sleep({("sm_90a", "float32"): 0.6, ("sm_90a", "bfloat16"): 0.4}.get((name, dtypes[0]), 0.0))
        return [{"target": name, "dtype": d} for d in dtypes]

    monkeypatch.setattr(targets, "compile_target", compile_target)
    plan = {"sm_90a": ("float32", "bfloat16"), "x86-64-v3": ("float32", "q4_0"), "sm_80": ("bfloat16",)}
    rows = targets.run(plan, "demo", 60, jobs=3)
    assert [(r["target"], r["dtype"]) for r in rows] == [(t, d) for t, ds in plan.items() for d in ds]
    assert sorted(started) == [("sm_80", ("bfloat16",)), ("sm_90a", ("bfloat16",)), ("sm_90a", ("float32",)),
                               ("x86-64-v3", ("float32", "q4_0"))]


def test_the_default_jobs_follow_the_cores_and_the_memory_available(monkeypatch):
    cores, memory = 16, 200.0
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(targets, "available_gb", lambda: memory)
    assert targets.default_jobs() == 8  # one per two cores
    memory = 3 * targets.GB_PER_JOB + 1
    assert targets.default_jobs() == 3  # as many as the memory available holds
    cores, memory = 2, 200.0
    assert targets.default_jobs() == 2  # two side by side still gain on two cores
    memory = 1.0
    assert targets.default_jobs() == 1  # but not past the memory


def test_an_interrupted_check_stops_the_targets_still_compiling(monkeypatch, capsys):
    """Ctrl-C while targets compile side by side: their processes, each in a
    session of its own that the terminal's signal does not reach, are
    stopped, not waited for."""
    import signal
    import threading
    import time

    compiling = subprocess.Popen(["sleep", "120"], start_new_session=True)  # stands for a target's compile

    def compile_target(name, dtypes, model, timeout, program, again=False):
        targets.RUNNING.add(compiling)
        compiling.wait()
        targets.RUNNING.discard(compiling)
        return []

    monkeypatch.setattr(targets, "compile_target", compile_target)
    # Ctrl-C as a terminal's Python gets it (a test worker of pytest-xdist ignores SIGINT).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    ctrl_c = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    start = time.perf_counter()
    ctrl_c.start()
    try:
        targets.run({"sm_90a": ("float32",), "x86-64-v3": ("float32",)}, "demo", 600, jobs=2)
        raise AssertionError("the interruption did not reach the caller")
    except KeyboardInterrupt:
        pass
    finally:
        ctrl_c.cancel()
        signal.signal(signal.SIGINT, previous)
        if compiling.poll() is None:
            compiling.kill()
    assert compiling.wait(timeout=5) == -signal.SIGKILL and time.perf_counter() - start < 30


def test_a_stopped_check_starts_no_more_processes(monkeypatch):
    """A thread of the pool that reaches its start after Ctrl-C stopped the
    others starts nothing (it would compile on, unseen, until its timeout)."""
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))
    targets.STOPPED.set()
    try:
        assert targets.compile_target("sm_90a", ("float32",), "demo", 60) == [] and not targets.RUNNING
    finally:
        targets.STOPPED.clear()
