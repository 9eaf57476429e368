"""tests/suite_graphs.py's groups, as the start of a run on two workers needs them."""

from __future__ import annotations

from conftest import SLOWEST_FIRST
from suite_graphs import GROUPS


def test_the_two_files_that_start_a_run_compile_the_two_units_side_by_side():
    # A file listed in two groups takes both units' locks in turn while the other worker's
    # file waits for one of them: a cold run measured a core half idle for ~4 min so.
    files = [loader for group in GROUPS.values() for loader in group if "::" not in loader]
    assert len(files) == len(set(files))
    first = [next((name for name, group in GROUPS.items() if file in group), None) for file in SLOWEST_FIRST[:2]]
    assert sorted(first) == sorted(GROUPS)
