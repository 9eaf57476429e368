"""docs/pytorch-to-max.md: every Python block on the page runs against MAX
26.7, so the primer cannot go stale; every row of its table links a section."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from checker import maxrun

PRIMER = Path(__file__).resolve().parent.parent / "docs" / "pytorch-to-max.md"
TEXT = PRIMER.read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", TEXT, re.S | re.M)
SECTIONS = re.findall(r"^## (.+)$", TEXT, re.M)


def anchor(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block {i}" for i in range(len(BLOCKS))])
def test_every_snippet_runs(code):
    with maxrun.interpreter():
        exec(compile(code, str(PRIMER), "exec"), {"__name__": "primer"})


def test_every_table_row_links_a_section():
    links = re.findall(r"\]\(#([^)]+)\)", TEXT)
    assert len(links) >= 10 and set(links) <= {anchor(s) for s in SECTIONS}


def test_the_steps_link_existing_rows():
    solutions = sorted((PRIMER.parent.parent / "solutions").glob("solution_*.py"))
    links = [a for path in solutions for a in re.findall(r"docs/pytorch-to-max\.md#([\w-]+)", path.read_text())]
    assert len(links) >= 10 and set(links) <= {anchor(s) for s in SECTIONS}
