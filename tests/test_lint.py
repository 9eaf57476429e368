"""The tree passes the linter: ruff with the rules in pyproject.toml's [tool.ruff]
(pyflakes, import order, pycodestyle's errors, 120-character lines, no stale
`# noqa`), run here so that the suite, and so CI, fails on a new violation."""

from __future__ import annotations

import importlib.util

from conftest import run_python


def test_ruff_finds_nothing():
    assert importlib.util.find_spec("ruff"), "ruff is not installed: it is pinned in pyproject.toml's test extra"
    done = run_python("-m", "ruff", "check", "--no-cache", ".", timeout=120)
    assert done.returncode == 0, (
        "ruff check . found problems (fix them, or `python -m ruff check --fix .` for imports):\n"
        + done.stdout + done.stderr)
