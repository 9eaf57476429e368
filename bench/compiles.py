"""``python -m bench.compiles``: where a test run's compile time goes.

Runs the suite as CI does (pixi.toml's ``test`` task) with every compile
and load of MAX's ``InferenceSession`` logged, in every process of the
run (bench/compile_log), then prints each test file's compile seconds and
the longest compiles, each with the test that caused it and what it
compiled (a graph's name, or an eager op's ops). With empty caches
(``XDG_CACHE_HOME`` pointed at a new folder) that is a cold CI's census:
which graphs, which eager ops, and how long each took on this machine.

    XDG_CACHE_HOME=$(mktemp -d) python -m bench.compiles --log /tmp/compiles.jsonl
    python -m bench.compiles --log /tmp/compiles.jsonl --report    # the report again
    python -m bench.compiles --log /tmp/c.jsonl -- tests/test_quantize.py   # some tests only

Each worker's files, in the order it ran them, with when each started, its
seconds and its compiles' seconds, close the report: where a cold run's two
workers waited, and which file ran last.

A compile shorter than a second was served from a cache (MAX's or a saved graph's); the
report counts the rest. Seconds are wall time, so two workers compiling side
by side each count their own.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOOKS = Path(__file__).resolve().parent / "compile_log"  # sitecustomize.py and the pytest plugin
COLD = 1.0  # seconds: below this a "compile" was served from a cache


def test_command() -> list[str]:
    """pixi.toml's ``test`` task, with this interpreter for its ``python``."""
    sys.path.insert(0, str(ROOT))
    from tasks import task_argv

    return task_argv("test")


def run(log: Path, pytest_args: list[str]) -> int:
    for path in (log, Path(f"{log}.tests")):
        path.unlink(missing_ok=True)
    env = dict(os.environ, GPT2_MAX_COMPILE_LOG=str(log))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOKS), env.get("PYTHONPATH")]))
    return subprocess.call([*test_command(), "-p", "compile_log_plugin", *pytest_args], cwd=ROOT, env=env)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def attribute(compiles: list[dict], tests: list[dict]) -> None:
    """Each compile's test: the one running on its worker when it started
    (a process that outlives its test, as MAX's compile pool does, carries a
    stale test name in its environment)."""
    by_worker = collections.defaultdict(list)
    for t in sorted(tests, key=lambda t: t["start"]):
        by_worker[t["worker"]].append(t)
    for c in compiles:
        runs = by_worker.get(c["worker"], [])
        i = bisect.bisect_right([t["start"] for t in runs], c["start"]) - 1
        if i >= 0 and runs[i]["start"] <= c["start"] <= runs[i]["end"]:
            c["test"] = runs[i]["test"]
        c["test"] = c["test"].split(" (")[0]  # PYTEST_CURRENT_TEST ends with " (call)"


def report(log: Path, longest: int = 25) -> str:
    compiles = read(log)
    attribute(compiles, read(Path(f"{log}.tests")))
    cold = [c for c in compiles if c["s"] >= COLD]
    files = collections.defaultdict(lambda: [0.0, 0])
    for c in cold:
        entry = files[c["test"].split("::")[0] or "(outside a test)"]
        entry[0] += c["s"]
        entry[1] += 1
    lines = [f"{len(cold)} compiles of {COLD:.0f} s or more, {sum(c['s'] for c in cold):.0f} s in all "
             f"({len(compiles) - len(cold)} shorter: served from a cache)", "",
             "| test file | compile s | compiles |", "|---|---|---|"]
    lines += [f"| {name} | {s:.0f} | {n} |" for name, (s, n) in sorted(files.items(), key=lambda kv: -kv[1][0])]
    lines += ["", f"the {longest} longest:", "", "| s | what | test | process |", "|---|---|---|---|"]
    for c in sorted(cold, key=lambda c: -c["s"])[:longest]:
        program, *rest = c["argv"] or ["-c"]
        process = "" if program == "-c" or "pytest" in program else " ".join([Path(program).name, *rest])
        lines.append(f"| {c['s']:.0f} | {c['what']} | {c['test']} | {process} |")
    return "\n".join(lines + timeline(read(Path(f"{log}.tests")), cold))


def timeline(tests: list[dict], cold: list[dict]) -> list[str]:
    """Each worker's files in the order it ran them: start (seconds from the
    run's first test), seconds, and the seconds of the compiles in it."""
    if not tests:
        return []
    zero = min(t["start"] for t in tests)
    lines = ["", "each worker's files, in order:", "", "| worker | start s | file | s | compile s |",
             "|---|---|---|---|---|"]
    for worker in sorted({t["worker"] for t in tests}):
        runs = sorted((t for t in tests if t["worker"] == worker), key=lambda t: t["start"])
        spans: list[list] = []  # [file, start, end]
        for t in runs:
            file = t["test"].split("::")[0]
            if spans and spans[-1][0] == file:
                spans[-1][2] = t["end"]
            else:
                spans.append([file, t["start"], t["end"]])
        for file, start, end in spans:
            compiled = sum(c["s"] for c in cold if c["worker"] == worker and c["test"].split("::")[0] == file)
            lines.append(f"| {worker or '-'} | {start - zero:.0f} | {file} | {end - start:.0f} | {compiled:.0f} |")
        lines.append(f"| {worker or '-'} | {runs[-1]['end'] - zero:.0f} | (its last test ended) | | |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compiles", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n")[2] + "\n\nArguments after -- go to pytest "
                                "(default: the whole suite).")
    p.add_argument("--log", type=Path, default=Path("compiles.jsonl"), help="where the log goes (default: %(default)s)")
    p.add_argument("--report", action="store_true", help="only print the report of an earlier run's log")
    p.add_argument("--longest", type=int, default=25, help="how many of the longest compiles to list")
    p.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    log = args.log.resolve()
    rc = 0 if args.report else run(log, args.pytest_args)
    if not log.is_file():
        print(f"no compile log at {log}", file=sys.stderr)
        return rc or 2
    print(report(log, args.longest))
    return rc


if __name__ == "__main__":
    sys.exit(main())
