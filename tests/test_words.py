"""The tree speaks of the project and its users: no issue numbers (a reader
cannot look them up; name the behaviour instead) and no words of the setting
it was developed in. docs/journal.md, the dated record, is exempt."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXEMPT = {"docs/journal.md", "tests/test_words.py"}  # the record; and this file, which names the patterns
# Data, not prose: the demo's vocabulary has "lent" (a word of its Bible text).
DATA = ("tests/reference/",)
PATTERNS = {
    "an issue number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    "a lent machine": re.compile(r"\blent (GPU|machine|H1|session)", re.IGNORECASE),
    "the runner's own names": re.compile(r"device tool|KINDS\.md|can_start_another"),
}


def prose_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in listed if f not in EXEMPT and not f.startswith(DATA)
            and f.endswith((".py", ".md", ".toml", ".yml", ".mojo", ".txt", ".cfg")) or f in (".gitignore",)]


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="the files are listed by git, absent here")
def test_no_issue_numbers_or_words_of_where_it_was_made():
    found = []
    for path in prose_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for what, pattern in PATTERNS.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_the_check_finds_what_it_looks_for():
    assert PATTERNS["an issue number"].search("fixed in issue 43's run")
    assert PATTERNS["a lent machine"].search("on a lent GPU machine")
    assert not PATTERNS["a lent machine"].search("the Lord lent it")
