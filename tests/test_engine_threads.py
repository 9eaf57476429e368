"""model/engine_threads.py: after the first graph call on the CPU, MAX's
background threads run at the lowest priority, and nothing else does (the
Python threads, MAX's compute workers). Linux only, like the code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities through /proc")

PROBE = r"""
import json, os, sys, threading, time
sys.path[:0] = [{root!r}, {tests!r}]
import numpy as np
from checkpoints import reference
from model.gpt2 import load_gpt2

def nice(tid):
    return int(open(f"/proc/{{os.getpid()}}/task/{{tid}}/stat").read().rsplit(")", 1)[1].split()[16])

def comm(tid):
    return open(f"/proc/{{os.getpid()}}/task/{{tid}}/comm").read().strip()

waiting = threading.Event()
mine = threading.Thread(target=waiting.wait, daemon=True)  # a thread of the user's: left alone
mine.start()
gpt2 = load_gpt2(reference("tiny-2l-4h")[0], device="cpu", with_tokenizer=False)
from model import engine_threads
gpt2.step(np.array([[1, 2, 3]]), gpt2.empty_cache(1, 8))
time.sleep(0.2)
tasks = sorted(int(t) for t in os.listdir(f"/proc/{{os.getpid()}}/task"))
print(json.dumps({{"threads": [[t, comm(t), nice(t)] for t in tasks], "main": threading.main_thread().native_id,
                   "mine": mine.native_id, "background": engine_threads.background_threads(),
                   "again": engine_threads.quiet_background_threads()}}))
"""


def test_max_s_background_threads_are_lowered_after_the_first_step_and_nothing_else():
    code = PROBE.format(root=str(ROOT), tests=str(ROOT / "tests"))
    # env passed explicitly: an eager MAX op earlier in the session leaves its own
    # PYTHONPATH in the C-level environment (see conftest.run_python).
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    nice = {tid: value for tid, _, value in probe["threads"]}
    workers = [tid for tid, name, _ in probe["threads"] if name.startswith("🔥")]
    assert workers, probe  # MAX's CPU workers, by the name the code relies on
    assert probe["background"], probe  # MAX starts its own threads
    assert all(nice[tid] == 19 for tid in probe["background"]), probe
    assert all(nice[tid] == 0 for tid in [probe["main"], probe["mine"], *workers]), probe
    assert probe["mine"] not in probe["background"] and probe["main"] not in probe["background"]
    assert probe["again"] == []  # once per process
