"""Where a served step's time goes: the model's graph, or the engine around it.

With ``GPT2_MAX_STEP_TIMES=FILE`` in its environment, the server's model
worker appends one JSON line per engine step to FILE:

    {"start": 12.3456, "graph_s": 0.0231, "sequences": 1, "tokens": 1}

``start`` is when the engine called the model (a monotonic clock, seconds),
``graph_s`` how long the model took (its inputs staged, its graph run and
waited for), ``sequences`` the batch's sequences and ``tokens`` the tokens it
processed (as many as the sequences in a decode step; more when a prompt is in
the step). The time from one step's start to the next one's that the graph did
not take is the engine's: its scheduler, batch preparation, sampler and
responses. ``python -m bench.serve --step-times`` sets the variable and
prints the summary (``summary``). Without the variable nothing is timed.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

VARIABLE = "GPT2_MAX_STEP_TIMES"


@contextmanager
def timed_step(sequences: int, tokens: int, synchronize):
    """Time one call of the model, when VARIABLE names a file; ``synchronize``
    waits for the device, so that what was queued on it is counted."""
    path = os.environ.get(VARIABLE)
    if not path:
        yield
        return
    start = time.perf_counter()
    yield
    synchronize()
    line = {"start": start, "graph_s": time.perf_counter() - start, "sequences": sequences, "tokens": tokens}
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(steps: list[dict], idle_s: float = 0.25) -> list[dict]:
    """Per kind of step (decode or with a prompt) and batch size: how many,
    and the medians of the graph's time, of the time to the next step's start
    and of the difference (the engine's). A gap longer than ``idle_s`` is the
    server waiting for requests, not a step: it is left out of the intervals."""
    groups: dict[tuple[str, int], list[tuple[float, float | None]]] = {}
    for step, after in zip(steps, [*steps[1:], None]):
        interval = after["start"] - step["start"] if after else None
        if interval is not None and interval - step["graph_s"] > idle_s:
            interval = None
        kind = "decode" if step["tokens"] == step["sequences"] else "with a prompt"
        groups.setdefault((kind, step["sequences"]), []).append((step["graph_s"], interval))
    rows = []
    for (kind, sequences), times in sorted(groups.items()):
        followed = [(g, i) for g, i in times if i is not None]  # steps with a next step to measure to
        rows.append({"kind": kind, "sequences": sequences, "steps": len(times),
                     "graph_ms": 1e3 * statistics.median(g for g, _ in times),
                     "step_ms": 1e3 * statistics.median(i for _, i in followed) if followed else None,
                     "engine_ms": 1e3 * statistics.median(i - g for g, i in followed) if followed else None})
    return rows


def table(rows: list[dict]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [f"{'step':<14} {'sequences':>9} {'steps':>6} {'graph ms':>9} {'step ms':>8} {'engine ms':>10} "
             f"{'engine share':>12}"]
    for r in rows:
        share = "-" if r["engine_ms"] is None or not r["step_ms"] else f"{r['engine_ms'] / r['step_ms']:.0%}"
        lines.append(f"{r['kind']:<14} {r['sequences']:>9} {r['steps']:>6} {ms(r['graph_ms']):>9} "
                     f"{ms(r['step_ms']):>8} {ms(r['engine_ms']):>10} {share:>12}")
    return "\n".join(lines)
