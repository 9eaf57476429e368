"""A pytest plugin (``-p compile_log_plugin``, put on the path by
``python -m bench.compiles``): one JSON line per test with its worker and
when it ran, so that a compile in a process that outlives its test (MAX's
compile pool) is put down to the test running on that worker at the time."""

from __future__ import annotations

import json
import os
import time

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.time()
    try:
        return (yield)
    finally:
        line = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                "start": round(start, 2), "end": round(time.time(), 2)}
        with open(os.environ["GPT2_MAX_COMPILE_LOG"] + ".tests", "a") as log:
            log.write(json.dumps(line) + "\n")
