"""``python -m maintain.targets`` (``pixi run targets``): compile the app's graph,
without running it, for hardware that is not here: NVIDIA GPUs, other
x86-64 CPUs, Arm (``--help`` has examples).

MAX compiles for a machine it does not run on when told so before any
device exists: a virtual GPU (``set_virtual_device_api`` / ``_target_arch``
/ ``_count``) makes ``Accelerator()`` a stand-in that compiles and refuses
to run, and ``set_virtual_cpu_target`` compiles the CPU's kernels for a
named CPU. Both are process-wide, so each target compiles in a process of
its own, and each of a GPU target's precisions too, so that a machine with
cores to spare compiles them side by side (by default one process per two
cores, at least two, as memory allows). The graph is the one ``load_gpt2``
builds for the app (the same build, the same layers, this project's
kernels), compiled and never run:
virtual-device mode makes MAX return a compile-only model instead of
initialising it, for CPU targets too, so code for another CPU is never
executed here.

One line per target and precision: the time it took, or the compiler's
first error line. It catches what the compiler sees (a missing kernel or
dtype for a target, PTX or Arm code generation failing, this project's
Mojo kernels not building for a CPU); not wrong numbers, nor faults at run
time. Nothing is saved for later runs (``GPT2_MAX_SAVED_GRAPHS=0``); MAX's
own cache for these builds lives apart, in this project's cache folder
(``targets/``), so nothing compiled for another machine reaches a real run.

What a compile finds follows from what it is given: the traced graph, this
project's Mojo kernels, the weights handed to it (MAX checks their names,
shapes and dtypes against the graph's parameters), MAX's version and the
target. So each process first traces its graph (seconds) and looks it up in
``maintain/compiled_targets.json``, the record of graphs this check compiled
(``--record`` writes the rows it compiled there), keyed by the traced body's
digest, the kernels' digest, a digest of the code that makes the weights
(``WEIGHT_SOURCES``), MAX's version and the target: a match is not compiled
again, and its row says when it was. A change to any of them compiles anew;
``--again`` compiles whatever the record says. Not in the key: the host CPU
a GPU target's host-side code is compiled for (the recording machine's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from artifacts import atomic
from artifacts.files import files_digest
from artifacts.targets import TARGETS, Target, compile_for
from model.device import DTYPES, QUANTIZED_DTYPES, bfloat16_fault
from model.max_internals import build_kv_cache_ops

ROOT = Path(__file__).resolve().parent.parent


# A GPU's precisions: float32, and bfloat16 under a MAX release not known to compute it wrong
# (model/device.py's bfloat16_fault: a build refuses it there).
GPU_DTYPES = ("float32",) if bfloat16_fault() else ("float32", "bfloat16")
CPU_DTYPES = ("float32", *QUANTIZED_DTYPES)
GB_PER_JOB = 4.5  # a target's compile at its peak, with room (docs/platforms.md)


def available_gb() -> float:
    """Memory new processes can have (MemAvailable), or all of it where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def default_jobs() -> int:
    """Processes compiling at a time: MAX's compiler keeps fewer than two
    cores busy, so one per two cores and at least two (a second process
    beside the first still gains on two cores), never more than the memory
    now available holds (at least one)."""
    return max(1, min(max(2, (os.cpu_count() or 1) // 2), int(available_gb() // GB_PER_JOB)))


SIZES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # --model: random checkpoints of GPT-2's sizes


def ci_plan(every_host: bool = False) -> dict[str, tuple[str, ...]]:
    """What every CI run compiles: the GPU most users rent (H100/H200) in
    its precisions (GPU_DTYPES: float32, the default, and bfloat16 on request
    where MAX computes it right),
    and the x86-64 kernel path this CPU does not run, in float32 and q4_0
    (both of this project's kernel files; q4_0's band differs between the
    paths). The path this CPU does run, the rest of the suite compiles and
    runs natively; so every run covers both x86-64 paths. ``every_host``:
    what CI compiles on any machine, both x86-64 paths (what ``--record`` keeps)."""
    from model import cpu

    if every_host:
        others = ("x86-64-v3", "x86-64-v4-vnni")
    else:
        others = ("x86-64-v3" if cpu.native_path() == "avx512-vnni" else "x86-64-v4-vnni",)
    return {"sm_90a": GPU_DTYPES, **dict.fromkeys(others, ("float32", "q4_0"))}


def checkpoint(model: str) -> Path:
    """The checkpoint whose shapes are compiled: the bundled demo, a random
    one of a GPT-2 size (gpt2 is 124M; written once into the cache folder),
    or a folder."""
    if model in SIZES:
        from model.caches import random_checkpoint

        return random_checkpoint(model)
    from weights import resolve_model

    return Path(resolve_model(model))


def first_error_line(exc: BaseException) -> str:
    """The line of a (often long) compiler message that names the error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    named = next((line for line in lines if "error" in line.lower()), lines[0])
    return f"{type(exc).__name__}: {named}"[:300]


def enter_virtual_mode(target: Target) -> None:
    """Make this process compile for ``target`` (before any device exists).
    Virtual-device mode, for a CPU target too: MAX then returns a compile-only
    model rather than initialising one (which would run the target's code here)."""
    from model.max_internals import WARM_STORE

    # A shipped warm store (checker/eager_kernels.py) holds the CPU's eager kernels only; with a
    # (virtual) GPU in sight MAX would ask it for that GPU's too and fail: compile them instead.
    os.environ.pop(WARM_STORE, None)
    compile_for(target, compile_only=True)


def build_options(target: Target, dtype: str):
    """The build options of ``target``'s graph at ``dtype``: on its kind of device."""
    from model.options import BuildOptions

    return BuildOptions(device="gpu" if target.gpu else "cpu", dtype=dtype)


def build_app_graph(folder: Path, target: Target, dtype: str) -> str:
    """The app's graph for ``target``, compiled by the app's own build; what to say beside it."""
    from model.gpt2 import load_gpt2

    gpt2 = load_gpt2(folder, build_options(target, dtype), with_tokenizer=False)
    return f"{gpt2.quantized_layers} quantized layers" if gpt2.quantized_layers else ""


def trace_app_graph(folder: Path, target: Target, dtype: str):
    """The app's graph for ``target`` at ``dtype``, traced, not compiled: what ``build_app_graph`` compiles."""
    from model.course import config_class
    from model.gpt2 import traced_graph
    from weights import open_checkpoint

    options = build_options(target, dtype)
    return traced_graph(open_checkpoint(folder).config_as(config_class(options.impl)), options)


@dataclass(frozen=True)
class Check:
    """One graph the targets check compiles: the program whose child process
    compiles it (``python -m PROGRAM --one TARGET``), the graph in words, the
    precisions it has on a GPU and on a CPU, its build, its trace (the graph
    the build compiles, not compiled) and what CI compiles."""

    program: str
    graph: str
    gpu_dtypes: tuple[str, ...]
    cpu_dtypes: tuple[str, ...]
    build: Callable[[Path, Target, str], str]
    trace: Callable[[Path, Target, str], object]
    ci_plan: Callable[..., dict[str, tuple[str, ...]]]  # (every_host=False): see ci_plan

    def dtypes(self, target: Target) -> tuple[str, ...]:
        return self.gpu_dtypes if target.gpu else self.cpu_dtypes


APP = Check("maintain.targets", "the app's graph", GPU_DTYPES, CPU_DTYPES, build_app_graph, trace_app_graph, ci_plan)
RECORD = ROOT / "maintain" / "compiled_targets.json"  # what this check compiled: python -m maintain.targets --record


def record_key(program: str, row: dict) -> str:
    return f"{program} {row['target']} {row['dtype']} {row['model']}"


# The code that makes the weights a build hands MAX's compile (their names, shapes and dtypes, which the
# compile checks against the graph's parameters): checkpoint reading, the head widened, bfloat16, the
# quantized blocks, the server's weight adapter. Its bytes are part of a record's key.
WEIGHT_SOURCES = ("weights/*.py", "model/gpt2.py", "model/quantize.py", "model/caches.py",
                  "serve/weight_adapters.py", "serve/model_config.py")


def what_compiles(name: str, digest: str) -> dict:
    """What a compile of the traced graph ``digest`` for target ``name`` is given, as a record's key."""
    import importlib.metadata

    from model.graph_source import kernels_digest

    target = TARGETS[name]
    weights = files_digest(sorted(path for pattern in WEIGHT_SOURCES for path in ROOT.glob(pattern)), ROOT)
    return {"graph": digest, "kernels": kernels_digest(), "weights": weights[:16],
            "max": importlib.metadata.version("max"), "arch": target.gpu or target.cpu}


def read_record() -> dict:
    """The record's entries by key ({} where there is none, or it cannot be read: then everything compiles)."""
    try:
        return json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {}


def recorded(program: str, row: dict, facts: dict) -> dict | None:
    """The record of this row's graph compiled before with the same ``facts``, if there is one."""
    entry = read_record().get(record_key(program, row))
    return entry if entry and all(entry.get(k) == v for k, v in facts.items()) else None


def write_record(program: str, rows: list[dict]) -> int:
    """The rows this run compiled (not those it found recorded), added to the record; how many."""
    record = read_record()
    new = [row for row in rows if row["compiled"] and not row.get("recorded")]
    for row in new:
        record[record_key(program, row)] = {**row["facts"], "compiled": time.strftime("%Y-%m-%d"),
                                            "seconds": row["seconds"]}
    with atomic.writing(RECORD) as staged:
        staged.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")
    return len(new)


def compile_one(check: Check, name: str, dtypes: list[str], model: str, again: bool = False) -> int:
    """In this process (a fresh one): set the virtual target, then for each
    precision trace the graph, and build it unless the record holds it
    (``again``: build it whatever the record says). One JSON line per
    precision on stdout."""
    enter_virtual_mode(TARGETS[name])
    folder = checkpoint(model)
    for dtype in dtypes:
        print(json.dumps(target_row(check, name, dtype, model, folder, again)), flush=True)
    return 0


def target_row(check: Check, name: str, dtype: str, model: str, folder: Path, again: bool = False) -> dict:
    """One precision of one target, in a process already in that target's
    virtual mode: its graph traced, then compiled unless the record holds it."""
    from model.graph_source import graph_digest

    target = TARGETS[name]
    start = time.perf_counter()
    row = {"target": name, "dtype": dtype, "model": model}
    try:
        row["facts"] = what_compiles(name, graph_digest(check.trace(folder, target, dtype)))
        earlier = None if again else recorded(check.program, row, row["facts"])
        if earlier:
            row.update(compiled=True, recorded=True, detail=f"the same graph, kernels, weights and MAX compiled on "
                       f"{earlier.get('compiled', '?')} in {earlier.get('seconds', '?')} s; not compiled again")
        else:
            row.update(compiled=True, detail=check.build(folder, target, dtype))
    except Exception as exc:  # the compiler's refusal is the result
        row.update(compiled=False, detail=first_error_line(exc))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def environment() -> dict[str, str]:
    """A child's: nothing saved, MAX's cache for other machines kept apart,
    and no kernel path forced (each target's own is the one to check)."""
    from model import caches, cpu

    env = dict(os.environ, GPT2_MAX_SAVED_GRAPHS="0", PYTHONUNBUFFERED="1")
    env.pop(cpu.ENV, None)
    env["MODULAR_CACHE_DIR"] = str(caches.folder("targets") / "modular")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


RUNNING: set[subprocess.Popen] = set()  # the targets' processes now compiling: stopped with the check
STARTING = threading.Lock()  # held to start a process and to stop them all: none starts after the stop
STOPPED = threading.Event()  # the check is being stopped: no more processes
PRINTING = threading.Lock()  # rows from targets compiled side by side: one whole line at a time


def stop_group(child: subprocess.Popen) -> None:
    """Kill a target's process and the compilers it started (its own group)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:  # it had ended already
        pass


def compile_target(name: str, dtypes: tuple[str, ...], model: str, timeout: float,
                   program: str = APP.program, again: bool = False) -> list[dict]:
    """One target's process (``python -m PROGRAM --one``); its rows printed as
    they come. A process that ends early (a crash, a signal, the timeout)
    fails the rows it did not report, naming why."""
    command = [sys.executable, "-m", program, "--one", name, "--model", model, "--dtypes", *dtypes,
               *(["--again"] if again else [])]
    rows, why = [], None
    with tempfile.TemporaryFile("w+") as errors:
        with STARTING:
            if STOPPED.is_set():
                return []
            child = subprocess.Popen(command, cwd=ROOT, env=environment(), stdout=subprocess.PIPE, stderr=errors,
                                     text=True, start_new_session=True)  # its own group: a timeout stops its compilers
            RUNNING.add(child)

        def stop() -> None:
            nonlocal why
            why = f"stopped after {timeout:g} s"
            stop_group(child)

        timer = threading.Timer(timeout, stop)
        timer.start()
        try:
            for line in child.stdout:
                if line.startswith("{"):
                    rows.append(json.loads(line))
                    show(rows[-1])
            child.wait()
        except BaseException:
            stop_group(child)
            raise
        finally:
            timer.cancel()
            RUNNING.discard(child)
        errors.seek(0)
        why = why or (errors.read().strip().splitlines() or [f"exit {child.returncode}"])[-1]
    for dtype in dtypes[len(rows):]:
        rows.append({"target": name, "dtype": dtype, "model": model, "compiled": False, "seconds": None,
                     "detail": f"the compiling process ended: {why}"[:300]})
        show(rows[-1])
    return rows


def show(row: dict) -> None:
    result = ("compiled before" if row.get("recorded") else f"compiled in {row['seconds']:.1f} s") \
        if row["compiled"] else "FAILED"
    if row["detail"]:
        result += f" ({row['detail']})" if row["compiled"] else f": {row['detail']}"
    with PRINTING:
        print(f"{row['target']:<16}{row['dtype']:<11}{result}", flush=True)


def run(plan: dict[str, tuple[str, ...]], model: str, timeout: float, program: str = APP.program,
        jobs: int = 1, again: bool = False) -> list[dict]:
    """Each target in a process of its own, and each of a GPU target's
    precisions (they share no compiled kernel, so a machine with cores to
    spare compiles them side by side; a CPU target's precisions share many,
    one after the other in one process); ``jobs`` processes at a time. The
    rows are printed as they come and returned in the plan's order."""
    print(f"model: {model}\n{'target':<16}{'precision':<11}result", flush=True)
    work = [item for name, dtypes in plan.items()
            for item in ([(name, (d,)) for d in dtypes] if TARGETS[name].gpu else [(name, dtypes)])]
    STOPPED.clear()
    with ThreadPoolExecutor(jobs) as pool:
        try:
            done = pool.map(lambda item: compile_target(*item, model, timeout, program, again), work)
            return [row for rows in done for row in rows]
        except BaseException:  # Ctrl-C, or a failure of this process's own: no target goes on compiling
            pool.shutdown(wait=False, cancel_futures=True)
            with STARTING:
                STOPPED.set()
                for child in list(RUNNING):
                    stop_group(child)
            raise


USAGE = """\
examples:
  python -m {program}                  every target, every precision, the demo's shapes
  python -m {program} --ci             what CI compiles on every run
  python -m {program} sm_80 neoverse-n1 --model gpt2 --dtypes float32
  python -m {program} --ci --record    what CI compiles on any machine, recorded (maintain/compiled_targets.json)
"""


def main(argv: list[str] | None = None, check: Check = APP) -> int:
    plan_ci = ", ".join(f"{n} ({' '.join(d)})" for n, d in check.ci_plan().items())
    p = argparse.ArgumentParser(
        prog=f"python -m {check.program}", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(width=88, text=f"Compile {check.graph}, without running it, for hardware that is "
                    "not here (MAX's virtual targets): NVIDIA GPUs, x86-64 CPUs with and without AVX-512, Arm. "
                    "One line per target and precision: the time it took, or the compiler's first error line. "
                    "It catches what the compiler sees (a missing kernel or dtype, PTX or Arm code generation, "
                    "this project's kernels), not wrong numbers. Nothing is saved for later runs. docs/platforms.md."),
        epilog=USAGE.format(program=check.program) + "\ntargets:\n"
        + "\n".join(f"  {n:<16}{t.means}" for n, t in TARGETS.items()))
    p.add_argument("targets", nargs="*", metavar="TARGET", help="targets to compile (default: all; listed below)")
    p.add_argument("--dtypes", nargs="+", choices=[d for d in DTYPES if d != "auto"], metavar="DTYPE",
                   help="precisions: " + ", ".join(d for d in DTYPES if d != "auto") + " (default: "
                        f"{' and '.join(check.gpu_dtypes)} on GPUs; {', '.join(check.cpu_dtypes)} on CPUs)")
    p.add_argument("--model", default="demo", help="demo (default), gpt2 (GPT-2 124M's shapes, a random checkpoint "
                                                   "written once), gpt2-medium/-large/-xl, or a checkpoint folder")
    p.add_argument("--ci", action="store_true", help=f"what CI compiles on this machine: {plan_ci} (with "
                   "--record: what CI compiles on any machine)")
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds per process (a target, or one of a GPU target's precisions) before its rows fail "
                        "(default: 1800)")
    jobs = default_jobs()
    p.add_argument("--jobs", type=int, default=jobs,
                   help="processes compiling at a time: one per target, and per precision on a GPU (default: "
                        f"{jobs} here: one per two cores, at least 2, as the memory available holds at "
                        f"{GB_PER_JOB:g} GB each)")
    p.add_argument("--again", action="store_true",
                   help="compile every graph, also those the record (maintain/compiled_targets.json) says were "
                        "compiled with the same kernels, weights' code and MAX")
    p.add_argument("--record", action="store_true",
                   help="add the graphs this run compiled to maintain/compiled_targets.json, so that later runs "
                        "(CI's among them) need not compile them again while they stay the same")
    p.add_argument("--json", type=Path, help="also write the results there")
    p.add_argument("--one", metavar="TARGET", help=argparse.SUPPRESS)  # the child: one target, JSON lines
    args = p.parse_args(argv)
    if args.one:
        return compile_one(check, args.one, args.dtypes or list(check.dtypes(TARGETS[args.one])), args.model,
                           args.again)
    unknown = [n for n in args.targets if n not in TARGETS]
    if unknown:
        p.error(f"unknown target {', '.join(unknown)}; targets: {', '.join(TARGETS)}")
    if args.ci and (args.targets or args.dtypes):
        p.error("--ci names its own targets and precisions; give either --ci or TARGET/--dtypes")
    model = args.model
    if model != "demo" and model not in SIZES:
        if not Path(model).is_dir():
            p.error(f"--model {model}: no such folder (demo, {', '.join(SIZES)} or a folder)")
        model = str(Path(model).resolve())  # the children run from the repository root
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    checkpoint(model)  # a random checkpoint written once, here, before the targets' processes read it
    build_kv_cache_ops()  # MAX's Mojo module built once, here, before processes import it side by side
    if args.ci:  # recorded: what CI compiles on any machine
        plan = check.ci_plan(every_host=args.record)
    else:
        plan = {n: tuple(args.dtypes) if args.dtypes else check.dtypes(TARGETS[n]) for n in args.targets or TARGETS}
    rows = run(plan, model, args.timeout, check.program, args.jobs, args.again)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    failed = [r for r in rows if not r["compiled"]]
    before = sum(1 for r in rows if r.get("recorded"))
    print(f"{len(rows) - len(failed)} of {len(rows)} compiled"
          + (f" ({before} of them before, as recorded in {RECORD.relative_to(ROOT)})" if before else ""), flush=True)
    if args.record:
        print(f"{write_record(check.program, rows)} added to {RECORD.relative_to(ROOT)}", flush=True)
    elif len(rows) - len(failed) > before:
        print(f"(--record adds what this run compiled to {RECORD.relative_to(ROOT)}: later runs then skip it)",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
