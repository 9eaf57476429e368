"""The documentation holds together: the book builds strict with a page per step, every
relative link in README.md and docs/*.md resolves (anchors included, as GitHub makes
them), and the README stays a page a newcomer reads in ten minutes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import book  # noqa: E402  (docs/book.py)

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "weights" / "demo" / "MODEL_CARD.md"]


def outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def github_anchor(heading: str) -> str:
    heading = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return heading.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {github_anchor(h) for h in re.findall(r"^#+ (.*)$", outside_code(page.read_text()), flags=re.M)}


def relative_links(page: Path) -> list[str]:
    links = re.findall(r"\]\(([^)\s]+)\)", outside_code(page.read_text()))
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for link in relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
            continue
        if anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading makes #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_is_short():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    long = [line[:60] for line in outside_code(text).splitlines() if len(line) > 200 and not line.startswith("|")]
    assert not long, f"README lines over 200 characters outside code and tables: {long}"


def test_book_builds_strict_with_a_page_per_step(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "book.py"), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for step in book.STEPS:
        page = site / "steps" / f"step-{step}" / "index.html"
        assert page.exists(), f"no page for step {step}"
    assert "Step 02: the causal mask" in (site / "steps" / "step-02" / "index.html").read_text()


def test_step_pages_come_from_the_solutions_docstrings():
    for step in book.STEPS:
        page = book.step_page(step)
        assert page.startswith(f"# Step {step}") or page.startswith(f"# Bonus step {int(step)}"), page[:60]
        assert f"pixi run s{step}" in page
