"""The tree speaks of the project and its users: no issue numbers (a reader
cannot look them up; name the behaviour instead) and no words of the setting
it was developed in: its work periods, budgets, the transfers to a machine
and what they carried, machine-time allowances."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXEMPT = {"tests/test_words.py"}  # this file, which names the patterns
# Data, not prose: the demo's vocabulary has "lent" (a word of its Bible text).
DATA = ("tests/reference/",)
PATTERNS = {
    "an issue number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    "a lent machine": re.compile(r"\blent (GPU|machine|H1|session)", re.IGNORECASE),
    "the runner's own names": re.compile(r"device tool|KINDS\.md|can_start_another"),
    "an issue in place of its behaviour": re.compile(r"\bthe issue(?:'s)?\b", re.IGNORECASE),
    "a work period": re.compile(r"\b(?:later|earlier|next|new|another|third|fourth|fifth|sixth|seventh|eighth|"
                                r"working) (?:stop|session)s?\b|\bthe stop (?:after|before)\b", re.IGNORECASE),
    "a budget": re.compile(r"\bbudgets?\b", re.IGNORECASE),
    "a transfer call": re.compile(r"\bcalls? to (?:a|the) (?:GPU|device) machine|\b(?:each|every|one|a|this) call"
                                  r"(?:'s)? (?:carries|carried|brings|limit)|\bthe call's (?:limit|\d+ minutes)",
                                  re.IGNORECASE),
    "what a transfer carried": re.compile(r"\bcarry\s*=|\bcarr(?:y|ied) (?:one |a |the |each )?(?:\w+ )?pieces?\b",
                                          re.IGNORECASE),
    "the runner's output folder": re.compile(r"\$OUT\b"),
    "a machine-time allowance": re.compile(r"\bdevice (?:time|minutes)\b|\bminutes of device\b|\btime allowance\b",
                                           re.IGNORECASE),
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
    assert PATTERNS["an issue in place of its behaviour"].search("n_head >= 4, as the issue asks")
    for said in ("measured in a later stop", "the stop after", "another session's run", "a third stop"):
        assert PATTERNS["a work period"].search(said), said
    for said in ("--stop TEXT", "generation stops", "a session of its own", "InferenceSession(devices)"):
        assert not PATTERNS["a work period"].search(said), said
    assert PATTERNS["a budget"].search("under the 60-min budget")
    assert PATTERNS["a transfer call"].search("each call to the GPU machine carries 64 MiB")
    assert PATTERNS["a transfer call"].search("stopped at the call's limit")
    assert not PATTERNS["a transfer call"].search("one token per call, reusing the cache")
    assert PATTERNS["what a transfer carried"].search('run(command="...", carry=[".gpu/kit"])')
    assert PATTERNS["what a transfer carried"].search("carry the last piece")
    assert not PATTERNS["what a transfer carried"].search("values carry no position")
    assert PATTERNS["the runner's output folder"].search("logs in $OUT")
    assert PATTERNS["a machine-time allowance"].search("15 minutes of device time a session")
