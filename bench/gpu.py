"""``python -m bench.gpu STAGE...``: the figures docs/gpu.md reports, measured on a machine
with an NVIDIA GPU, in stages that each take at most about ten minutes on an H100 or H200
with empty caches, so that any one can be run, or run again, alone.

    python -m bench.gpu check                    # does MAX see the card, and does the app run on it?
    python -m bench.gpu bench bench-plain        # GPT-2 124M: replayed decode and HF, then plain calls
    python -m bench.gpu --list                   # every stage and its commands

Each stage's commands run one after another in this interpreter's environment (MAX and
torch both importable: torch runs the Hugging Face baselines), each line of their
output written to ``<logs>/<stage>.log`` after the seconds since the command started,
as it comes, and a line per command to ``<logs>/summary.txt``. The exit status is the
first failing command's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from tasks import task_argv, task_env

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "And it came to pass"


def stages(python: str, hf_python: str, logs: Path) -> dict[str, list[list[str]]]:
    """Each stage's commands, in the order they are worth running."""
    generate = [python, "-m", "model", "--model", "demo", "--device", "gpu", "--temperature", "0",
                "--max-new-tokens", "12", PROMPT]
    bench = [python, "-m", "bench", "--device", "gpu", "--dtypes", "float32"]
    hf, no_hf = ["--hf-python", hf_python], ["--hf-python", ""]  # no_hf: not even GPT2_MAX_HF_PYTHON's
    served = [python, "-m", "bench.serve", "--device", "gpu", "--no-llama-cpp"]
    # The suite hides the GPUs (tests/conftest.py); the GPU's tests run with them in sight, as `test-gpu` does.
    gpus_in_sight = ["env", *(f"{name}={value}" for name, value in task_env("test-gpu").items())]
    return {
        # Is MAX there, does it see the card, and does the app run on it, its decode steps replayed or not?
        "check": [*([["nvidia-smi"]] if shutil.which("nvidia-smi") else []),
                  [python, "-c", "import sys, max; from model.device import accelerator_count; "
                                 "print('python', sys.version.split()[0], '| accelerators', accelerator_count())"],
                  generate, [*generate[:3], "--no-replay", *generate[3:]]],
        # The tests written for a GPU: replayed decode against plain calls, the bfloat16 probes, the device choice.
        "tests": [[*gpus_in_sight, *task_argv("test-gpu", python), "-s", "-ra", "-k", "not serve"]],
        # Logits and greedy text against Hugging Face on the same card (float32: bfloat16 is refused under a
        # MAX known to compute it wrong, and measured where it is not).
        "accuracy": [[python, "-m", "bench.accuracy", "--device", "gpu", "--checkpoints", "demo", "--dtypes",
                      "float32", "--hf-python", hf_python, "--json", str(logs / "accuracy.json")]],
        # GPT-2 124M: decode replayed from captured device graphs, against HF's eager and compiled generation
        # (a static cache and torch.compile(mode="reduce-overhead")); the weights' reads as a share of the card's.
        "bench": [[*bench, *hf, "--json", str(logs / "bench-gpt2.json")]],
        # The same without replay: every decode step a plain graph call over the in-place cache.
        "bench-plain": [[*bench, "--no-replay", *no_hf, "--json", str(logs / "bench-gpt2-plain.json")]],
        # gpt2-xl (1.5B), replayed, against HF eager; then against HF compiled, whose compile takes the rest of a
        # stage (this project's graph is then loaded, not compiled again).
        "bench-xl": [[*bench, "--size", "gpt2-xl", *hf, "--hf-modes", "eager",
                      "--json", str(logs / "bench-gpt2-xl.json")]],
        "bench-xl-compiled": [[*bench, "--size", "gpt2-xl", *hf, "--hf-modes", "compiled",
                               "--json", str(logs / "bench-gpt2-xl-compiled.json")]],
        "bench-xl-plain": [[*bench, "--size", "gpt2-xl", "--no-replay", *no_hf, "--json",
                            str(logs / "bench-gpt2-xl-plain.json")]],
        # The server on the card (float32) against the app's text (tests/test_gpu.py's serve test).
        "serve": [[*gpus_in_sight, python, "-m", "pytest", "-ra", "tests/test_gpu.py", "-k", "serve"]],
        # The server's output tokens a second against HF's generate in a loop on the same card, 1, 8 and 32
        # clients: a stage of its own, the server's cold compile taking most of one.
        "bench-serve": [[python, "-m", "bench.serve", "--device", "gpu", "--hf-python", hf_python,
                         "--json", str(logs / "bench-serve.json")]],
        # The server with MAX's device graph capture (which brings MAX's overlap scheduler with it): its tokens
        # a second at 1, 8 and 32 clients (docs/serving.md says why the architecture does not declare it yet).
        "serve-capture": [[*served, "--serve-flag=--device-graph-capture", "--json", str(logs / "serve-capture.json")]],
        # Where a served step's time goes at one client (the graph against the engine around it), without
        # capture and with it.
        "serve-steps": [[*served, "--step-times", "--concurrency", "1", "--json", str(logs / "serve-steps-plain.json")],
                        [*served, "--step-times", "--concurrency", "1", "--serve-flag=--device-graph-capture",
                         "--json", str(logs / "serve-steps-capture.json")]],
    }


def timed(command: list[str], log, cwd: Path = ROOT) -> int:
    """Runs ``command``, each line of its output into ``log`` after the seconds since it started: a stage
    stopped midway still says how far it got. Returns when the command exits, as subprocess.run does,
    even where a process it left running (a server, say) still holds its output open."""
    stopped, start = threading.Event(), time.perf_counter()

    def copy(stream) -> None:
        for line in stream:
            if stopped.is_set():
                return
            log.write(f"[{time.perf_counter() - start:4.0f} s] {line.rstrip(chr(10))}\n")
            log.flush()

    child = subprocess.Popen(command, cwd=cwd, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, errors="replace")
    reader = threading.Thread(target=copy, args=(child.stdout,), daemon=True)
    reader.start()
    rc = child.wait()
    reader.join(timeout=5)
    stopped.set()
    return rc


def run(names: list[str], plan: dict[str, list[list[str]]], logs: Path) -> int:
    """The stages ``names`` of ``plan``, logged into ``logs``; the first failing command's exit status."""
    logs.mkdir(parents=True, exist_ok=True)
    worst = 0
    for name in names:
        with (logs / f"{name}.log").open("a") as log:
            for command in plan[name]:
                shown = " ".join(command)
                log.write(f"\n$ {shown}\n")
                log.flush()
                start = time.perf_counter()
                rc = timed(command, log)
                line = f"{name}: exit {rc} in {time.perf_counter() - start:.0f} s: {shown}"
                log.write(line + "\n")
                with (logs / "summary.txt").open("a") as summary:
                    summary.write(line + "\n")
                print(line, flush=True)
                worst = worst or rc
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stages", nargs="*", metavar="STAGE", help="the stages to run, in order (--list names them)")
    p.add_argument("--logs", type=Path, default=ROOT / "gpu-logs", help="where the logs go (default: gpu-logs/)")
    p.add_argument("--hf-python", default=os.environ.get("GPT2_MAX_HF_PYTHON") or sys.executable,
                   help="the interpreter with torch and transformers for the Hugging Face baselines "
                        "(default: GPT2_MAX_HF_PYTHON, else this one)")
    p.add_argument("--list", action="store_true", help="print every stage's commands and exit")
    args = p.parse_args(argv)
    plan = stages(sys.executable, args.hf_python, args.logs)
    if args.list or not args.stages:
        for name, commands in plan.items():
            print(name + ":\n" + "\n".join("  " + " ".join(command) for command in commands))
        return 0
    unknown = [name for name in args.stages if name not in plan]
    if unknown:
        p.error(f"unknown stage {', '.join(unknown)}; stages: {', '.join(plan)}")
    return run(args.stages, plan, args.logs)


if __name__ == "__main__":
    sys.exit(main())
