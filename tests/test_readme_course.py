"""The README's quick start and course sections, as a newcomer without pixi reads them."""

from __future__ import annotations

import re

from checker.skeleton import ROOT

README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_quick_start_command_has_its_no_pixi_form_beside_it():
    start = _section("Quick start")
    tasks = re.findall(r"^pixi run (.+?)\s+#", start, re.M)
    assert tasks
    for task in tasks:
        assert f"python3.13 tasks.py {task}" in start, task


def test_the_learner_s_model_runs_offline_and_skipping_a_step_is_said():
    examples = re.findall(r"`((?:pixi run|python3.13 tasks.py) [^`]*--impl steps[^`]*)`", README)
    assert examples and all("--model demo" in line for line in examples), examples
    assert "To skip a step, copy its solution over it" in " ".join(README.split())
    assert "GPT2_MAX_BACKGROUND_COMPILE=0" in README and "own-graph-compile.log" in README
