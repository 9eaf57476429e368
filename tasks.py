#!/usr/bin/env python3.13
"""Run a pixi task without pixi.

    python3.13 tasks.py s01        # check step 01
    python3.13 tasks.py test       # the test suite
    python3.13 tasks.py --list     # every task

The tasks are read from the [tasks] table of pixi.toml, so pixi and this
script can never disagree. The first run creates ``.venv`` with Python 3.13 and
installs this project's pinned dependencies (pyproject.toml) into it; later
runs reuse it (and reinstall when pyproject.toml changes). Extra arguments are
passed on to the task's command.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("GPT2_MAX_VENV", ROOT / ".venv"))
STAMP = VENV / ".installed-from"


def load_tasks() -> dict[str, dict]:
    """pixi.toml's tasks as {name: {"cmd": ..., "description": ..., "env": {...}}}."""
    with open(ROOT / "pixi.toml", "rb") as f:
        table = tomllib.load(f).get("tasks", {})
    return {name: ({"cmd": spec} if isinstance(spec, str) else spec) for name, spec in table.items()}


def task_argv(task: str, python: str = sys.executable) -> list[str]:
    """``task``'s command as a list, ``python`` standing for its ``python``
    (for tools that run a task under an interpreter of their own)."""
    words = shlex.split(load_tasks()[task]["cmd"])
    return [python if words[0] == "python" else words[0], *words[1:]]


RUNNER = "GPT2_MAX_TASK_RUNNER"  # how the learner runs tasks, for messages that name a command


def task_env(task: str) -> dict[str, str]:
    """The environment variables ``task`` sets (its ``env`` table in pixi.toml)."""
    return {name: str(value) for name, value in load_tasks()[task].get("env", {}).items()}


def task_command(task: str) -> str:
    """``task`` as the learner runs tasks here: ``pixi run TASK``, or
    ``python3.13 tasks.py TASK`` where this script ran it or pixi is not
    installed. Messages that name a command use this (imports only the
    standard library)."""
    runner = os.environ.get(RUNNER)
    if runner is None:
        runner = "pixi run" if os.environ.get("PIXI_PROJECT_ROOT") or shutil.which("pixi") else "python3.13 tasks.py"
    return f"{runner} {task}"


def venv_bin() -> Path:
    return VENV / ("Scripts" if os.name == "nt" else "bin")


def ensure_venv() -> None:
    """Create .venv and install the project's dependencies when needed."""
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == want:
        return
    if not (venv_bin() / "python").exists():
        print(f"tasks.py: creating {VENV} with Python {sys.version.split()[0]}", file=sys.stderr)
        venv.create(VENV, with_pip=True)
    print("tasks.py: installing the pinned dependencies from pyproject.toml (a minute or two)", file=sys.stderr)
    start = time.perf_counter()
    # pip's own stream (and any warnings from this machine's pip configuration)
    # is kept back: shown only when the install fails. --no-compile: Python
    # writes a module's bytecode when it is first imported, so the install does
    # not compile the thousands of modules nothing here imports (a third of it).
    done = subprocess.run(
        [str(venv_bin() / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-compile", "-e", f"{ROOT}[test]"],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        print(done.stdout + done.stderr, file=sys.stderr)
        raise SystemExit(f"tasks.py: installing the dependencies failed (pip exit {done.returncode}); "
                         "pip's output is above")
    print(f"tasks.py: dependencies installed in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    STAMP.write_text(want + "\n")


def main(argv: list[str]) -> int:
    tasks = load_tasks()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__.strip().splitlines()[0] + "\n\nTasks (from pixi.toml):")
        width = max(map(len, tasks))
        for name, spec in tasks.items():
            print(f"  {name:<{width}}  {spec.get('description', spec['cmd'])}")
        return 0 if argv else 2
    name, extra = argv[0], argv[1:]
    if name not in tasks:
        print(f"tasks.py: no task {name!r}; see `python3.13 tasks.py --list`", file=sys.stderr)
        return 2
    if sys.version_info[:2] != (3, 13):
        print(
            f"tasks.py: this project needs Python 3.13 (this is {sys.version.split()[0]}): "
            "MAX's eager calls cost minutes each on 3.11/3.12. Run `python3.13 tasks.py ...`.",
            file=sys.stderr,
        )
        return 2
    ensure_venv()
    env = dict(os.environ, VIRTUAL_ENV=str(VENV), PATH=f"{venv_bin()}{os.pathsep}{os.environ.get('PATH', '')}")
    env[RUNNER] = "python3.13 tasks.py"
    env.update(task_env(name))
    command = tasks[name]["cmd"] + "".join(" " + shlex.quote(arg) for arg in extra)
    return subprocess.run(command, shell=True, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
