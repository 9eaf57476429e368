"""Put on PYTHONPATH by ``python -m bench.compiles``: every process of the
run (the test workers, their children, MAX's compile pool) appends one JSON
line to ``$GPT2_MAX_COMPILE_LOG`` for each compile or load of MAX's
``InferenceSession``, with its seconds, the pytest worker it belongs to and
what was compiled. MAX is patched when it is first imported, not before, so
a process that never imports MAX pays nothing."""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import re
import sys
import threading
import time

LOG = os.environ.get("GPT2_MAX_COMPILE_LOG")
OPS = re.compile(r"\b(mo\.[a-z_.]+|rmo\.[a-z_.]+)")
SYMBOL = re.compile(r'symbol = "([^"]+)"')
_depth = threading.local()  # load() compiles through compile(): only the outermost call is logged


def _what(model) -> str:
    """A short name for what is compiled: a graph's name, or an eager op's ops."""
    name = getattr(model, "name", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(model, (str, os.PathLike)):
        return f"file {os.path.basename(os.fspath(model))}"
    try:
        text = str(model)[:200_000]
    except Exception:
        return type(model).__name__
    ops = sorted(set(SYMBOL.findall(text)) | {op for op in OPS.findall(text)
                                                if op not in ("mo.output", "mo.constant", "mo.graph")})
    return "eager: " + " ".join(ops)[:160]


def _log(method: str, model, start: float) -> None:
    try:
        line = {"method": method, "what": _what(model), "start": round(start, 2),
                "s": round(time.time() - start, 2), "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "argv": sys.argv[:3]}
        with open(LOG, "a") as log:
            log.write(json.dumps(line) + "\n")
    except Exception:
        pass


def _wrap(cls, method: str) -> None:
    original = getattr(cls, method)

    def timed(self, model, *args, **kwargs):
        start, depth = time.time(), getattr(_depth, "n", 0)
        _depth.n = depth + 1
        try:
            return original(self, model, *args, **kwargs)
        finally:
            _depth.n = depth
            if depth == 0:
                _log(method, model, start)

    setattr(cls, method, timed)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches ``max.engine.api.InferenceSession`` right after that module runs."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "max.engine.api":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for method in ("compile", "load"):
                _wrap(module.InferenceSession, method)

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _PatchOnImport())
