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
    ("Linux", "aarch64"): "compiled, not run: the targets check compiles the graph for Neoverse N1; no Arm "
                          "machine has run it",
    ("Darwin", "arm64"): "compiled, not run: the targets check compiles the CPU's graph for Apple M1; no Mac "
                         "has run it, and --device auto takes the CPU there",
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


def gpus() -> str:
    """The accelerators MAX sees, by architecture, and the GPU-visibility variables that are set."""
    from model.device import GPU_VISIBILITY, accelerator_count

    count = accelerator_count()
    hiding = [f"{name}={os.environ[name]!r}" for name in GPU_VISIBILITY if name in os.environ]
    hiding = f" ({', '.join(hiding)})" if hiding else ""
    if count == 0:
        return "none that MAX sees" + hiding
    try:
        from max.driver import Accelerator

        names = [f"{Accelerator(i).api} {Accelerator(i).architecture_name}" for i in range(count)]
    except Exception as exc:  # counted but not opened: say so rather than fail the report
        names = [f"(could not open: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"]
    return f"{count}: " + ", ".join(names) + hiding


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
    return [
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("system", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("max", version("max")),
        ("transformers", version("transformers")),
        ("cpu", f"{cpu.describe()} ({os.cpu_count()} cores)"
                + ("" if not cpu.is_x86() else
                   f"; AVX-512: {'yes' if 'avx512f' in cpu.flags() else 'no'}, VNNI: "
                   f"{'yes' if 'avx512_vnni' in cpu.flags() else 'no'}")),
        ("kernel path", os.environ.get(cpu.ENV, "auto") + f" (GPT2_MAX_KERNEL_PATH; auto is {cpu.native_path()})"),
        ("gpus", gpus()),
        ("--device auto", auto),
        ("project cache", f"{ours} {human(folder_size(ours)) if ours.is_dir() else '(none yet)'}"
                          + (f": {parts}" if ours.is_dir() else "")),
        ("MAX cache", f"{modular} {human(folder_size(modular)) if modular.is_dir() else '(none yet)'}"),
        ("platform", SUPPORT.get(system, "untested: nothing has compiled or run on this platform (docs/platforms.md)")),
    ]


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
