"""The app and the first steps on an emulated Arm CPU (aarch64 Linux): a check run by hand.

Not a pytest module: it needs an emulator and an hour or more of it. On an x86-64
Linux machine where you are root, with Debian's package archive and PyPI at hand:

    .venv/bin/python tests/arm_under_qemu.py setup    # ~2 min: an aarch64 Python 3.13, MAX's aarch64 wheels, QEMU
    .venv/bin/python tests/arm_under_qemu.py run      # the demo's greedy text at float32, q8_0, q4_0; steps 01-03
    .venv/bin/python tests/arm_under_qemu.py run q8_0 # one precision's texts only
    .venv/bin/python tests/arm_under_qemu.py run --model gpt2 float32  # GPT-2 124M's shape (a random checkpoint)

``setup`` puts everything under ``$ARM_ROOT`` (default /tmp/arm): Debian trixie's
arm64 ``python3.13`` and the libraries it needs, unpacked into a root folder
(``apt-get download`` with the arm64 architecture and a lists folder of its own:
the machine's apt state is not touched); this project's dependencies as
aarch64 wheels installed into one folder (offline/bundle.py's download, for
``--platform aarch64 --python 3.13``); Debian's ``qemu-user-static``; a
binfmt_misc entry, so that the aarch64 programs MAX starts (its compiler, ``mojo``)
run under QEMU too; and Debian's aarch64 cross linker (installed on this machine),
which ``mojo build`` reaches as ``cc``. ``run`` runs the app there, each precision in a process of
its own with a cache folder of its own (``$ARM_ROOT/cache``), and compares its
greedy text after a short prompt and after a long one (over 16 tokens) with the ones
this machine's native build writes (q4_0 packs bands of
8 rows on Arm, against 16 or 32 on x86: model/cpu.py); a line says when the
run used the graph shipped for Neoverse N1 (float32, the default build: model/graph_source.py)
rather than compiling. ``--model gpt2`` runs a random checkpoint of GPT-2 124M's shape instead of the
demo (the bench's, written once on this machine; its graph is shipped too), after the short
prompt only. Then it checks steps 01-03 with the solutions (with the eager
kernels shipped for Neoverse N1, nothing compiles: ``python -m checker.eager_kernels
check`` run under the same environment times every step). Times are the emulator's, not Arm's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARM = Path(os.environ.get("ARM_ROOT", "/tmp/arm"))
# A short prompt, and one of 26 tokens: more than the 16 rows up to which the
# float32 and Q8_0 ops run their own tiles, so their prompt paths (MAX's
# float32 matmul; on Arm q8_0's dequantized weights) run there too.
PROMPTS = ("And it came to pass",
           "And it came to pass, when the king heard the words of the law, that he rent his clothes."
           " And the king commanded")
DTYPES = ("float32", "q8_0", "q4_0")
DEBIAN = "deb http://deb.debian.org/debian trixie main"  # the first Debian with Python 3.13
# aarch64 ELF executables, as Debian's qemu-user-static registers them.
MAGIC = r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
BINFMT = Path("/proc/sys/fs/binfmt_misc")
CPU = "neoverse-n1"  # AWS Graviton2, Ampere Altra: QEMU_CPU


def apt(*args: str) -> list[str]:
    """apt-get / apt-cache options for arm64 packages, with state of their own under ARM."""
    lists, cache = ARM / "apt" / "lists", ARM / "apt" / "cache"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (cache / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (ARM / "apt" / "sources.list").write_text(DEBIAN + "\n")
    options = {"APT::Architecture": "arm64", "APT::Architectures": "arm64,amd64", "Dir::State::Lists": lists,
               "Dir::Etc::SourceList": ARM / "apt" / "sources.list", "Dir::Etc::SourceParts": "/nonexistent",
               "Dir::Cache": cache}
    return [*args, *(x for key, value in options.items() for x in ("-o", f"{key}={value}"))]


def setup() -> int:
    subprocess.run(apt("apt-get", "update", "-q"), check=True)
    wanted = ["python3.13", "python3.13-venv", "libstdc++6", "libgomp1", "libatomic1", "zlib1g", "libncurses6"]
    tree = subprocess.run(apt("apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                              "--no-breaks", "--no-replaces", "--no-enhances", "--no-pre-depends", *wanted),
                          check=True, capture_output=True, text=True).stdout
    packages = sorted({line for line in tree.splitlines() if line and not line.startswith((" ", "<"))})
    debs = ARM / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    subprocess.run(apt("apt-get", "download", "-q", *packages), check=True, cwd=debs)
    root = ARM / "root"
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    for link in ("lib", "bin"):  # merged /usr: base-files would make these
        if not (root / link).exists():
            (root / link).symlink_to(f"usr/{link}")
    # QEMU 10 (trixie's qemu-user, static): it shows the emulated CPU's /proc/cpuinfo, so MAX
    # compiles for the Neoverse N1 it emulates. Bookworm's 7.2 shows the x86 host's.
    subprocess.run(apt("apt-get", "download", "-q", "qemu-user:amd64"), check=True, cwd=ARM)
    subprocess.run(["dpkg", "-x", str(next(ARM.glob("qemu-user_*.deb"))), str(ARM / "qemu")], check=True)
    subprocess.run(["apt-get", "install", "-y", "-q", "gcc-aarch64-linux-gnu", "g++-aarch64-linux-gnu"], check=True)
    site()
    register()
    machine = subprocess.run([str(python()), "-c", "import platform; print(platform.machine())"], env=arm_env(),
                             capture_output=True, text=True).stdout.strip()
    print(f"ready: {python()} runs as {machine}")
    return 0


def site() -> None:
    """This project's dependencies as aarch64 wheels, installed into ARM/site."""
    sys.path.insert(0, str(ROOT))
    from offline import bundle as kit

    target = kit.platform_args("3.13", "aarch64")
    wheels = ARM / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    resolved, alone = kit.requirements()
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels), *target]
    subprocess.run([*pip, *resolved], check=True)
    subprocess.run([*pip, "--no-deps", *alone], check=True)
    shutil.rmtree(ARM / "site", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(ARM / "site"), *target, *map(str, sorted(wheels.glob("*.whl")))], check=True)


def register() -> None:
    """aarch64 executables run by QEMU, for the programs MAX starts (binfmt_misc; root)."""
    entry = BINFMT / "qemu-aarch64"
    if entry.exists():
        return
    qemu = ARM / "qemu" / "usr" / "bin" / "qemu-aarch64"
    if not (BINFMT / "register").exists():  # a machine that has not mounted it (systemd does at boot)
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True)
    (BINFMT / "register").write_text(f":qemu-aarch64:M::{MAGIC}:{MASK}:{qemu}:F")


def cross_tools() -> Path:
    """A folder of cc, gcc, ld, ... naming Debian's aarch64 cross tools (apt-get install
    gcc-aarch64-linux-gnu g++-aarch64-linux-gnu), which run natively."""
    folder = ARM / "xbin"
    folder.mkdir(parents=True, exist_ok=True)
    tools = {"cc": "gcc", "c++": "g++", **{t: t for t in ("gcc", "g++", "ld", "ar", "as", "nm", "objcopy", "strip",
                                                            "ranlib")}}
    for name, tool in tools.items():
        link = folder / name
        if not link.exists():
            link.symlink_to(f"/usr/bin/aarch64-linux-gnu-{tool}")
    return folder


def python() -> Path:
    return ARM / "root" / "usr" / "bin" / "python3.13"


def arm_env() -> dict[str, str]:
    """The emulated processes' environment: Arm's linker first on PATH (``mojo build`` links
    through ``cc``; the x86 one fails on aarch64 objects: Debian's gcc-aarch64-linux-gnu)."""
    return dict(os.environ, QEMU_LD_PREFIX=str(ARM / "root"), QEMU_CPU=CPU, PYTHONUNBUFFERED="1",
                PATH=os.pathsep.join([str(cross_tools()), os.environ.get("PATH", "")]),
                PYTHONPATH=os.pathsep.join([str(ARM / "site"), str(ROOT)]), XDG_CACHE_HOME=str(ARM / "cache"))


def greedy(python_path: str, dtype: str, prompt: str, env: dict, model: str = "demo") -> tuple[dict, float]:
    """The app's JSON line (``shipped``: whether it ran the graph shipped with the project), and its seconds."""
    sys.path.insert(0, str(ROOT))
    from model.graph_source import USING

    start = time.perf_counter()
    done = subprocess.run([python_path, "-m", "model", "--model", model, "--dtype", dtype, "--temperature", "0",
                           "--max-new-tokens", "12", "--json", prompt], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["?"]}, time.perf_counter() - start
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "shipped": any(line.startswith(USING) for line in done.stderr.splitlines())}, \
        time.perf_counter() - start


def run(dtypes: list[str], steps: bool, model: str = "demo") -> int:
    register()  # a no-op where the entry is there
    failures = 0
    if model != "demo":
        sys.path.insert(0, str(ROOT))
        from model.caches import random_checkpoint

        model = str(random_checkpoint(model))
    for dtype in dtypes:
        for n, prompt in enumerate(PROMPTS if model == "demo" else PROMPTS[:1]):
            here, _ = greedy(sys.executable, dtype, prompt, dict(os.environ), model)
            if "tokens" not in here:  # the native run is the reference: run this with the project's Python
                print(f"{dtype:8} prompt {n + 1} x86-64 FAILED: {here}", flush=True)
                failures += 1
                continue
            there, seconds = greedy(str(python()), dtype, prompt, arm_env(), model)
            same = "tokens" in there and there["tokens"] == here["tokens"]
            failures += not same
            native = "" if same else f" / x86-64: {here.get('text', here)!r}"
            shipped = ", the shipped graph" if there.get("shipped") else ""
            print(f"{dtype:8} prompt {n + 1} aarch64 {'same' if same else 'DIFFERENT'} ({seconds:.0f} s{shipped}): "
                  f"{there.get('text', there)!r}{native}", flush=True)
    for step in ("01", "02", "03") if steps else ():
        start = time.perf_counter()
        done = subprocess.run([str(python()), "-m", "checker", step, "--solution"], capture_output=True, text=True,
                              env=arm_env(), cwd=ROOT)
        failures += done.returncode != 0
        last = (done.stdout.strip().splitlines() or ["?"])[-1]
        print(f"step {step}  aarch64 {'passed' if done.returncode == 0 else 'FAILED'} "
              f"({time.perf_counter() - start:.0f} s): {last}", flush=True)
    return 1 if failures else 0


def main() -> int:
    command = sys.argv[1:2]
    if command == ["setup"]:
        return setup()
    if command == ["run"]:  # run [--model gpt2] [DTYPE ...]: those precisions only, no steps
        dtypes, model = sys.argv[2:], "demo"
        if dtypes[:1] == ["--model"]:
            model, dtypes = (dtypes[1:2] or ["?"])[0], dtypes[2:]
            if model not in ("demo", "gpt2"):
                print(f"unknown model {model!r}: choose from demo, gpt2")
                return 2
        unknown = [d for d in dtypes if d not in DTYPES]
        if "--model" in dtypes:
            print("--model comes first: run --model gpt2 [DTYPE ...]")
            return 2
        if unknown:
            print(f"unknown precision {unknown[0]!r}: choose from {', '.join(DTYPES)}")
            return 2
        return run(dtypes or list(DTYPES), steps=not dtypes and model == "demo", model=model)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
