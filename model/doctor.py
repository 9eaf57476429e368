"""``python -m model.doctor`` (``pixi run doctor``): what this machine is to
this project, in a dozen lines to paste into a bug report: Python and MAX,
the CPU's kernel path, the GPUs MAX sees and what ``--device auto`` takes,
the cache folders and their sizes, and how far this platform is proven
(docs/platforms.md). Compiles nothing, runs no graph: a second or two."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

# How far each platform is proven; docs/platforms.md holds the evidence.
SUPPORT = {
    ("Linux", "x86_64"): "supported: CI runs the whole suite on x86-64 Linux; both kernel paths (AVX-512 + VNNI, "
                         "AVX2) are compiled in every run and have run",
    ("Linux", "aarch64"): "compiled, run only under emulation: the targets check compiles the graph for Neoverse "
                          "N1, whose demo graph and checker kernels ship with the project; no Arm machine has run it",
    ("Darwin", "arm64"): "compiled, not run: the targets check compiles the CPU's graph for Apple M1; no Mac "
                         "has run it, and --device auto takes the CPU there",
}

# How far each GPU architecture is proven, by the name MAX gives it; the same page holds the evidence.
GPU_SUPPORT = {
    "sm_90a": "run: float32 (the default) on an H200 and an H100, equal to HF on the card; bfloat16 is wrong "
              "over several rows at once with MAX 26.7 (modular/modular#6883), so it is refused there",
    "sm_80": "compiled, not run: the targets check compiles it by hand; no A100 has run it",
    "sm_89": "compiled, not run: the targets check compiles it by hand; no L4 or RTX 40 has run it",
}


def folder_size(folder: Path) -> int:
    total = 0
    for base, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def human(n: int) -> str:
    """Bytes as people write them (1000 to the kilobyte, as du -h --si)."""
    for power, unit in ((9, "GB"), (6, "MB"), (3, "KB")):
        if round(n / 10 ** power, 1) >= 1:
            return f"{n / 10 ** power:.1f} {unit}"
    return f"{n} B"


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def seen_gpus() -> list[tuple[str, str]] | str:
    """(api, architecture) of each accelerator MAX sees, or why one it counted could not be opened."""
    from model.device import accelerator_count

    count = accelerator_count()
    if count == 0:
        return []
    try:
        from max.driver import Accelerator

        return [(Accelerator(i).api, Accelerator(i).architecture_name) for i in range(count)]
    except Exception as exc:  # counted but not opened: say so rather than fail the report
        return f"{count}: (could not open: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"


def gpus(seen: list[tuple[str, str]] | str | None = None) -> str:
    """The accelerators MAX sees, by architecture, and the GPU-visibility variables that are set."""
    from model.device import GPU_VISIBILITY

    seen = seen_gpus() if seen is None else seen
    hiding = [f"{name}={os.environ[name]!r}" for name in GPU_VISIBILITY if name in os.environ]
    hiding = f" ({', '.join(hiding)})" if hiding else ""
    if isinstance(seen, str):
        return seen + hiding
    if not seen:
        return "none that MAX sees" + hiding
    return f"{len(seen)}: " + ", ".join(f"{api} {arch}" for api, arch in seen) + hiding


def gpu_support(seen: list[tuple[str, str]] | str) -> str | None:
    """How far the GPUs MAX sees are proven; None where it sees none."""
    if isinstance(seen, str) or not seen:
        return None
    untested = "untested: nothing has compiled or run for it (docs/platforms.md)"
    return "; ".join(f"{arch} {GPU_SUPPORT.get(arch, untested)}" for arch in dict.fromkeys(arch for _, arch in seen))


def lines() -> list[tuple[str, str]]:
    from model import caches, cpu
    from model.device import DeviceError, auto_note, choose

    try:
        placement = choose("auto", "auto")
        auto = f"{placement.kind}, {placement.dtype}" + (f" ({note})" if (note := auto_note("auto")) else "")
    except DeviceError as exc:
        auto = f"refused: {exc}"
    modular = caches.max_cache()
    ours = caches.root()
    parts = ", ".join(f"{p.name} {human(folder_size(p))}" for p in sorted(ours.iterdir()) if p.is_dir()) \
        if ours.is_dir() else ""
    system = (platform.system(), platform.machine())
    seen = seen_gpus()
    rows = [
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("system", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("max", version("max")),
        ("transformers", version("transformers")),
        ("cpu", f"{cpu.describe()} ({os.cpu_count()} cores)"
                + ("" if not cpu.is_x86() else
                   f"; AVX-512: {'yes' if 'avx512f' in cpu.flags() else 'no'}, VNNI: "
                   f"{'yes' if 'avx512_vnni' in cpu.flags() else 'no'}")),
        ("kernel path", os.environ.get(cpu.ENV, "auto") + f" (GPT2_MAX_KERNEL_PATH; {auto_paths()})"),
        ("gpus", gpus(seen)),
        ("--device auto", auto),
        ("project cache", f"{ours} {human(folder_size(ours)) if ours.is_dir() else '(none yet)'}"
                          + (f": {parts}" if ours.is_dir() else "")),
        ("MAX cache", f"{modular} {human(folder_size(modular)) if modular.is_dir() else '(none yet)'}"),
        ("platform", SUPPORT.get(system, "untested: nothing has compiled or run on this platform (docs/platforms.md)")),
    ]
    if support := gpu_support(seen):
        rows.append(("gpu support", support))
    return rows


def auto_paths() -> str:
    """What ``auto`` compiles on this CPU: its own path, or per op where its
    microarchitecture runs one input row another way (model/cpu.py's ONE_ROW)."""
    from model import cpu

    own = cpu.native_path()
    if not cpu.is_x86():
        return f"auto is {own}"
    where = f"on this {cpu.microarchitecture()}"
    tiles = cpu.one_row_tiles()
    if not tiles:
        return f"auto is {own} {where}"
    return f"auto is {own} {where}, and for one input row (batch-1 decode): {cpu.describe_tiles(tiles)}"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m model.doctor", description=__doc__.split("\n\n")[0].replace("\n", " ")
                            .replace("``", "")).parse_args(argv)
    rows = lines()
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
