"""``python -m model.targets`` (``pixi run targets``): compile the app's graph,
without running it, for hardware that is not here: NVIDIA GPUs, other
x86-64 CPUs, Arm.

    python -m model.targets                  # every target, every precision, the demo's shapes
    python -m model.targets --ci             # what CI compiles on every run
    python -m model.targets sm_80 aarch64 --model gpt2 --dtypes float32

MAX compiles for a machine it does not run on when told so before any
device exists: a virtual GPU (``set_virtual_device_api`` / ``_target_arch``
/ ``_count``) makes ``Accelerator()`` a stand-in that compiles and refuses
to run, and ``set_virtual_cpu_target`` compiles the CPU's kernels for a
named CPU. Both are process-wide, so each target compiles in a process of
its own. The graph is the one ``load_gpt2`` builds for the app (the same
build, the same layers, this project's kernels), compiled and never run:
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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    means: str  # the hardware, in words
    gpu: str = ""  # an NVIDIA architecture (sm_90a), for a GPU target
    cpu: str = ""  # MAX's virtual CPU target, for a CPU target

    @property
    def dtypes(self) -> tuple[str, ...]:
        return GPU_DTYPES if self.gpu else CPU_DTYPES


GPU_DTYPES = ("float32", "bfloat16")
CPU_DTYPES = ("float32", "q8_0", "q6_k", "q4_0", "q4_0m")

TARGETS = {
    "sm_90a": Target("NVIDIA H100 / H200 (Hopper)", gpu="sm_90a"),
    "sm_80": Target("NVIDIA A100 (Ampere)", gpu="sm_80"),
    "sm_89": Target("NVIDIA L4, RTX 40 series (Ada)", gpu="sm_89"),
    "x86-64-v3": Target("x86-64 with AVX2 + FMA: the avx2 kernel path", cpu="x86-64-v3"),
    "x86-64-v4-vnni": Target("x86-64 with AVX-512 + VNNI: the avx512-vnni kernel path",
                             cpu="triple=x86_64-unknown-linux-gnu;cpu=x86-64-v4;features=+avx512vnni"),
    "aarch64": Target("Arm Linux (Neoverse N1: AWS Graviton2, Ampere Altra): the portable path",
                      cpu="triple=aarch64-unknown-linux-gnu;cpu=neoverse-n1"),
    "apple-m1": Target("Apple silicon's CPU (macOS): the portable path", cpu="triple=arm64-apple-darwin;cpu=apple-m1"),
}



def ci_plan() -> dict[str, tuple[str, ...]]:
    """What every CI run compiles, within a few minutes on a cold 2-core
    machine: the GPU most users rent (H100/H200) in its default precision,
    and the x86-64 kernel path this CPU does not run, in float32 and q4_0
    (both of this project's kernel files; q4_0's band differs between the
    paths). The path this CPU does run, the rest of the suite compiles and
    runs natively; so every run covers both x86-64 paths."""
    from model import cpu

    other = "x86-64-v3" if cpu.native_path() == "avx512-vnni" else "x86-64-v4-vnni"
    return {"sm_90a": ("bfloat16",), other: ("float32", "q4_0")}

MODELS = {"demo": ROOT / "weights" / "demo"}  # and "gpt2": a random checkpoint of GPT-2 124M's shapes


def checkpoint(model: str) -> Path:
    """The checkpoint whose shapes are compiled: the bundled demo, a random
    one of GPT-2 124M's shapes (written once into the cache folder), or a
    folder."""
    if model in MODELS:
        return MODELS[model]
    if model == "gpt2":
        from model import caches
        from weights.synthetic import write_checkpoint

        sizes = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12}
        folder = caches.root() / "targets" / "gpt2-random"
        if not (folder / "model.safetensors").is_file():
            write_checkpoint(folder.with_name(folder.name + ".partial"), sizes).rename(folder)
        return folder
    return Path(model)


def first_error_line(exc: BaseException) -> str:
    """The line of a (often long) compiler message that names the error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    named = next((line for line in lines if "error" in line.lower()), lines[0])
    return f"{type(exc).__name__}: {named}"[:300]


def compile_one(name: str, dtypes: list[str], model: str) -> int:
    """In this process (a fresh one): set the virtual target, then build each
    precision. One JSON line per precision on stdout."""
    from max import driver

    target = TARGETS[name]
    # Virtual-device mode, for a CPU target too: MAX then returns a compile-only
    # model rather than initialising one (which would run the target's code here).
    driver.set_virtual_device_api("cuda")
    driver.set_virtual_device_target_arch(target.gpu or "sm_90a")
    driver.set_virtual_device_count(1)
    if target.cpu:
        driver.set_virtual_cpu_target(target.cpu)
    from model.gpt2 import load_gpt2

    folder = checkpoint(model)
    for dtype in dtypes:
        start = time.perf_counter()
        try:
            gpt2 = load_gpt2(folder, device="gpu" if target.gpu else "cpu", dtype=dtype, with_tokenizer=False)
            row = {"compiled": True, "detail": f"{gpt2.quantized_layers} quantized layers" if gpt2.quantized_layers else ""}
        except Exception as exc:  # the compiler's refusal is the result
            row = {"compiled": False, "detail": first_error_line(exc)}
        row.update(target=name, dtype=dtype, model=model, seconds=round(time.perf_counter() - start, 1))
        print(json.dumps(row), flush=True)
    return 0


def environment() -> dict[str, str]:
    """A child's: nothing saved, MAX's cache for other machines kept apart."""
    from model import caches

    env = dict(os.environ, GPT2_MAX_SAVED_GRAPHS="0", PYTHONUNBUFFERED="1")
    env["MODULAR_CACHE_DIR"] = str(caches.root() / "targets" / "modular")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run(plan: dict[str, tuple[str, ...]], model: str, timeout: float) -> list[dict]:
    """Each target in a process of its own; its lines printed as they come."""
    rows = []
    print(f"{'target':<16}{'precision':<11}{'model':<7}result", flush=True)
    for name, dtypes in plan.items():
        command = [sys.executable, "-m", "model.targets", "--one", name, "--model", model, "--dtypes", *dtypes]
        try:
            done = subprocess.run(command, cwd=ROOT, env=environment(), capture_output=True, text=True,
                                  timeout=timeout)
            found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            found, tail = [], f"stopped after {timeout:.0f} s"
        for dtype in dtypes[len(found):]:  # the process died (a crash, a signal) before these
            found.append({"target": name, "dtype": dtype, "model": model, "compiled": False, "seconds": None,
                          "detail": f"the compiling process ended: {tail}"[:300]})
        for row in found:
            took = f"compiled in {row['seconds']:.1f} s" if row["compiled"] else "FAILED"
            detail = f" ({row['detail']})" if row["detail"] and row["compiled"] else (f": {row['detail']}" if row["detail"] else "")
            print(f"{row['target']:<16}{row['dtype']:<11}{row['model']:<7}{took}{detail}", flush=True)
        rows += found
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m model.targets", description=__doc__.split("\n\n")[0],
                                epilog="targets:\n" + "\n".join(f"  {n:<16}{t.means}" for n, t in TARGETS.items())
                                + "\n\n" + __doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", metavar="TARGET", help="targets to compile (default: all; see below)")
    p.add_argument("--dtypes", nargs="+", help="precisions (default: float32 and bfloat16 on GPUs; float32 and "
                                               "every quantized precision on CPUs)")
    p.add_argument("--model", default="demo", help="demo (default), gpt2 (GPT-2 124M's shapes) or a checkpoint folder")
    p.add_argument("--ci", action="store_true", help="what CI compiles: sm_90a in bfloat16, and the x86-64 "
                                                         "kernel path this CPU does not run in float32 and q4_0")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per target before it counts as failed")
    p.add_argument("--json", type=Path, help="also write the results there")
    p.add_argument("--one", metavar="TARGET", help=argparse.SUPPRESS)  # the child: one target, JSON lines
    args = p.parse_args(argv)
    if args.one:
        return compile_one(args.one, args.dtypes or list(TARGETS[args.one].dtypes), args.model)
    unknown = [n for n in args.targets if n not in TARGETS]
    if unknown:
        p.error(f"unknown target {', '.join(unknown)}; targets: {', '.join(TARGETS)}")
    if args.ci:
        plan = ci_plan()
    else:
        names = args.targets or list(TARGETS)
        plan = {n: tuple(args.dtypes) if args.dtypes else TARGETS[n].dtypes for n in names}
    rows = run(plan, args.model, args.timeout)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    failed = [r for r in rows if not r["compiled"]]
    print(f"{len(rows) - len(failed)} of {len(rows)} compiled", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
