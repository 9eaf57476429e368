"""`python -m serve` before and after its engine: what it refuses at start, in one line and
before MAX starts, and its processes ending with their parent (serve/lifeline.py). No server
is started here (tests/test_serve.py kills one of its own with SIGKILL)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_python

from bench.serve import free_port
from model.device import GPU_VISIBILITY
from serve.lifeline import PARENT
from weights.resolve import DEMO

ROOT = Path(__file__).resolve().parent.parent

@pytest.fixture(scope="module")
def busy_port():
    """A port something listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.fixture(scope="module")
def truncated(tmp_path_factory):
    """The demo checkpoint with its weights file cut in half."""
    folder = tmp_path_factory.mktemp("truncated") / "demo"
    shutil.copytree(DEMO, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


def demo_rewritten(folder: Path, change) -> Path:
    """The demo checkpoint in ``folder`` with its tensors passed through ``change`` (a dict -> dict)."""
    from safetensors.numpy import save_file

    from weights.checkpoint import read_safetensors

    shutil.copytree(DEMO, folder)
    state = {name: np.array(a) for name, a in read_safetensors(folder / "model.safetensors").items()}
    save_file(change(state), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def misnamed(tmp_path_factory):
    """The demo checkpoint with one tensor under another name."""
    def rename(state):
        key = next(k for k in state if k.endswith("h.0.mlp.c_fc.weight"))
        state[key.replace("c_fc", "c_fully")] = state.pop(key)
        return state

    return demo_rewritten(tmp_path_factory.mktemp("misnamed") / "demo", rename)


@pytest.fixture(scope="module")
def misshapen(tmp_path_factory):
    """The demo checkpoint with one tensor a column short."""
    def cut(state):
        key = next(k for k in state if k.endswith("h.1.attn.c_proj.weight"))
        state[key] = state[key][:, :-1].copy()
        return state

    return demo_rewritten(tmp_path_factory.mktemp("misshapen") / "demo", cut)


CASES = {
    "a port past 65535": (["--port", "70000"], "--port 70000: a port is a number from 1 to 65535"),
    "a port in use": (["--port", "{busy}"], "--port {busy}: 127.0.0.1:{busy} is in use"),
    "a metrics port in use": (["--metrics-port", "{busy}"], "--metrics-port {busy}: 127.0.0.1:{busy} is in use"),
    "one port for both": (["--port", "{free}", "--metrics-port", "{free}"], "--port and the metrics port are both"),
    "no sequences": (["--max-batch-size", "0"], "--max-batch-size must be at least 1, was 0"),
    "a window past the model's": (["--max-length", "4096"], "--max-length must be 1..256"),
    "no GPU": (["--device", "gpu"], "--device gpu: MAX sees no accelerator on this machine"),
    "a truncated checkpoint": (["--model", "{truncated}"], "model.safetensors: truncated"),
    "a tensor under another name": (["--model", "{misnamed}"], "no tensor h.0.mlp.c_fc.weight"),
    "a tensor of another shape": (["--model", "{misshapen}"], "h.1.attn.c_proj.weight has shape"),
}


@pytest.mark.parametrize("case", CASES)
def test_start_up_problems_are_one_line_and_exit_2_before_the_engine_starts(case, busy_port, truncated, misnamed,
                                                                           misshapen):
    """Each of these failed only once MAX's engine had started, after seconds, in a traceback of
    dozens of lines (exit status 1); now the launcher says it in one line and never starts it."""
    flags, said = CASES[case]
    names = {"busy": busy_port, "free": free_port(), "truncated": truncated, "misnamed": misnamed,
             "misshapen": misshapen}
    argv = ["--model", "demo", "--device", "cpu", "--port", str(free_port()), "--metrics-port", str(free_port()),
            *(flag.format(**names) for flag in flags)]
    env = {**os.environ, **dict.fromkeys(GPU_VISIBILITY, "")}  # no GPU in sight, whatever the machine
    start = time.monotonic()
    done = run_python("-m", "serve", *argv, timeout=120, env=env)
    seconds = time.monotonic() - start
    print(f"\n{case}: exit {done.returncode} after {seconds:.1f} s: {done.stderr.strip()}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("serve: ") and done.stderr.count("\n") == 1, done.stderr
    assert said.format(**names) in done.stderr
    assert "starting MAX's server" not in done.stdout


# A process that asks to end with its parent, then waits; its parent starts it, prints its pid,
# then waits too (each is ended by this test).
CHILD = ("import signal, time; from serve.lifeline import end_with_parent; end_with_parent(signal.SIGKILL); "
         "time.sleep(60)")
PARENT_OF_CHILD = ("import os, subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
                   f"env={{**os.environ, {PARENT!r}: str(os.getpid())}}); print(child.pid, flush=True); time.sleep(60)")


def gone(pid: int, within: float) -> bool:
    """Whether ``pid`` has ended (a zombie, ended but not reaped, has) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_process_of_the_server_ends_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT_OF_CHILD, CHILD], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env=dict(os.environ))
    child = int(parent.stdout.readline())
    try:
        time.sleep(1.0)  # the child has asked
        assert not gone(child, 0.1), "the child ended with its parent alive"
        parent.kill()
        parent.wait()
        assert gone(child, 5.0), "the child outlived its parent's SIGKILL"
    finally:
        for pid in (parent.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_process_whose_parent_ended_before_it_asked_ends_at_once():
    """Named as its parent, a process that is not (its parent ended in between: the child was
    handed to another) is taken to have ended."""
    done = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, PARENT: "1"}, timeout=30, cwd=ROOT)
    assert done.returncode == -signal.SIGKILL
