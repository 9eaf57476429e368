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

Both follow the CPU the kernels are compiled for: this one, unless MAX was
told to compile for another (``max.driver.set_virtual_cpu_target``, as
model/targets.py does); then ``compiled_for()`` reads that target's
architecture and features from its name.
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


# What LLVM's named x86-64 levels guarantee, as /proc/cpuinfo names the features.
X86_LEVELS = {"x86-64": (), "generic": (), "x86-64-v2": ("sse4_2",), "x86-64-v3": ("sse4_2", "avx2", "fma"),
              "x86-64-v4": ("sse4_2", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd")}


def virtual_target() -> str:
    """The CPU MAX compiles for when told to compile for another one
    (``set_virtual_cpu_target``), else "" (this CPU). MAX is not imported for
    this: a process that has not imported it has set no target."""
    import sys

    if "max" not in sys.modules:
        return ""
    from max import driver

    return driver.get_virtual_cpu_target()


def target_features(target: str) -> tuple[bool, frozenset[str]]:
    """(is it x86-64, its features as /proc/cpuinfo names them) for a
    virtual CPU target: an x86-64 level (``x86-64-v3``) or MAX's descriptor
    (``triple=x86_64-unknown-linux-gnu;cpu=x86-64-v4;features=+avx512vnni,-avx512f``).
    Only the x86-64 levels are known by name; another x86 CPU name is
    refused rather than guessed."""
    parts = [part.strip() for part in target.split(";") if part.strip()]
    fields = dict(part.split("=", 1) if "=" in part else ("cpu", part) for part in parts)
    name = fields.get("cpu", "generic").strip()
    triple = fields.get("triple", "x86_64-" if name in X86_LEVELS else platform.machine() + "-")
    if triple.split("-")[0].lower() not in ("x86_64", "amd64"):
        return False, frozenset()
    if name not in X86_LEVELS:
        raise ValueError(f"CPU target {target!r}: name an x86-64 level ({', '.join(X86_LEVELS)}) and its extra "
                         "features (features=+avx512vnni): model/cpu.py cannot tell this CPU's features from its name")
    spelled = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "sse4.2": "sse4_2", "avxvnni": "avx_vnni"}
    changes = [f.strip() for f in fields.get("feature", fields.get("features", "")).split(",") if f.strip()]
    named = lambda f: spelled.get(f[1:], f[1:])  # noqa: E731
    features = set(X86_LEVELS[name]) | {named(f) for f in changes if f.startswith("+")}
    return True, frozenset(features - {named(f) for f in changes if f.startswith("-")})


def compiled_for() -> tuple[bool, frozenset[str]]:
    """(x86-64?, features) of the CPU the kernels are compiled for."""
    target = virtual_target()
    return target_features(target) if target else (is_x86(), flags())


def native_path(cpu_flags: frozenset[str] | None = None) -> str:
    """The path ``auto`` resolves to for the CPU the kernels are compiled for
    (what isa.mojo's resolved() picks from MAX's compile target), or for a
    CPU with ``cpu_flags``."""
    x86, cpu_flags = compiled_for() if cpu_flags is None else (is_x86(), cpu_flags)
    if x86 and {"avx512f", "avx512_vnni"} <= cpu_flags:
        return "avx512-vnni"
    if x86 and "avx2" in cpu_flags:
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
    twice its float32 vector width (Mojo's simd_width_of[float32]), for the
    CPU the kernels are compiled for, or for a CPU with ``cpu_flags``."""
    x86, cpu_flags = compiled_for() if cpu_flags is None else (is_x86(), cpu_flags)
    if x86 and "avx512f" in cpu_flags:
        return 32
    if x86 and {"avx", "avx2"} & cpu_flags:
        return 16
    return 8  # 128-bit vectors: Arm's NEON, x86 below AVX


def describe() -> str:
    """One line for logs and saved graphs' names: the kernel path and q4_0
    band of the CPU compiled for (and its name, when it is not this one)."""
    target = virtual_target()
    return f"{platform.machine()} {native_path()} q4_0-band-{q4_0_band()}" + (f" target {target}" if target else "")
