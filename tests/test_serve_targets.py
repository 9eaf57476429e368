"""serve/targets.py: the server's graph (the course's model with the engine's
paged KV cache) compiled, never run, for hardware that is not here:
`python -m maintain.server_targets --ci`. A file of its own, so that a test run with
more than one worker compiles it beside the app's targets (tests/test_targets.py)."""

from __future__ import annotations

import json

from conftest import run_python, warn_unrecorded


def test_the_server_s_ci_targets_compile(tmp_path):
    """The server's graph for an H100/H200 in float32, on any machine."""
    out = tmp_path / "served.json"
    done = run_python("-m", "maintain.server_targets", "--ci", "--json", str(out), timeout=3600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["target"], r["dtype"], r["compiled"]) for r in rows] == [("sm_90a", "float32", True)]
    warn_unrecorded(rows, "maintain.server_targets")


def test_the_server_refuses_a_precision_it_does_not_serve(tmp_path):
    out = tmp_path / "served.json"
    done = run_python("-m", "maintain.server_targets", "x86-64-v3", "--dtypes", "q4_0", "--json", str(out), timeout=600)
    assert done.returncode == 1
    [row] = json.loads(out.read_text())
    assert not row["compiled"] and "the server runs bfloat16 and float32, not q4_0" in row["detail"]
