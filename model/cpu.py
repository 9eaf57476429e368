"""Which of model/kernels' code paths this CPU runs, and which it can.

The kernels come in three paths (model/kernels/isa.mojo), one chosen per op
call at compile time:

    avx512-vnni   64-byte vectors, 8-bit dot products with vpdpbusd
    avx2          32-byte vectors, 8-bit dot products with vpmaddubsw + vpmaddwd
    portable      plain vector arithmetic, any CPU MAX runs on

``auto`` (the default) lets the kernels pick from MAX's compile target, the
CPU at hand. ``GPT2_MAX_KERNEL_PATH=avx2`` (or a Linear's ``path=``) forces
one: the tests run every path this CPU can execute against numpy, so a
machine with AVX-512 also checks the code an AVX2-only CPU runs. A path the
CPU cannot execute is refused here with one line naming the missing
feature (running it would stop on an illegal instruction).

q4_0's weights are packed in bands of rows whose height MAX's own Q4_0
kernel fixes per target (twice its float32 vector width: 32 rows with
AVX-512, 16 with AVX2, 8 on Arm); ``q4_0_band()`` says which, and the op
reads any of them (it calls MAX's kernel only for the band that kernel reads).
"""

from __future__ import annotations

import functools
import os
import platform

from model.errors import DeviceError

ENV = "GPT2_MAX_KERNEL_PATH"
# The op parameter each path passes (model/kernels/isa.mojo's AUTO, AVX512_VNNI, AVX2, PORTABLE).
PATHS = {"auto": 0, "avx512-vnni": 1, "avx2": 2, "portable": 3}
# What each forced path executes, as /proc/cpuinfo names the features.
NEEDS = {"avx512-vnni": ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"), "avx2": ("avx2", "fma"), "portable": ()}


class KernelPathError(DeviceError):
    """A kernel path this CPU cannot execute; one line for the user."""


@functools.cache
def flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def native_path(cpu_flags: frozenset[str] | None = None) -> str:
    """The path ``auto`` resolves to on this CPU (what isa.mojo's resolved()
    picks from MAX's compile target)."""
    cpu_flags = flags() if cpu_flags is None else cpu_flags
    if is_x86() and {"avx512f", "avx512_vnni"} <= cpu_flags:
        return "avx512-vnni"
    if is_x86() and "avx2" in cpu_flags:
        return "avx2"
    return "portable"


def missing(path: str, cpu_flags: frozenset[str] | None = None) -> list[str]:
    """The CPU features ``path`` needs that this CPU lacks."""
    cpu_flags = flags() if cpu_flags is None else cpu_flags
    if path == "auto" or path == "portable":
        return []
    if not is_x86():
        return [f"an x86-64 CPU (this is {platform.machine()})"]
    return [flag for flag in NEEDS[path] if flag not in cpu_flags]


def runnable_paths() -> list[str]:
    """The forced paths this CPU can execute (the tests run each)."""
    return [path for path in NEEDS if not missing(path)]


def kernel_path(path: str | None = None) -> str:
    """``path``, else ``$GPT2_MAX_KERNEL_PATH``, else "auto"; refused with
    KernelPathError when unknown or when this CPU lacks what it executes."""
    chosen = path if path is not None else os.environ.get(ENV, "auto")
    source = f"{ENV}={chosen}" if path is None else f"kernel path {chosen!r}"
    if chosen not in PATHS:
        raise KernelPathError(f"{source}: choose one of {', '.join(PATHS)}")
    lacking = missing(chosen)
    if lacking:
        raise KernelPathError(f"{source}: this CPU lacks {', '.join(lacking)} (its own path is {native_path()}; "
                              f"unset {ENV} to use it)")
    return chosen


def q4_0_band(cpu_flags: frozenset[str] | None = None) -> int:
    """Rows per band of the q4_0 layout MAX's Q4_0 kernel reads on this CPU:
    twice its float32 vector width (Mojo's simd_width_of[float32])."""
    cpu_flags = flags() if cpu_flags is None else cpu_flags
    if is_x86():
        return 32 if "avx512f" in cpu_flags else 16
    return 8  # Arm: 128-bit NEON


def describe() -> str:
    """One line for logs and saved graphs' names: the CPU's kernel path and q4_0 band."""
    return f"{platform.machine()} {native_path()} q4_0-band-{q4_0_band()}"
