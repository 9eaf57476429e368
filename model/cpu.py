"""Which of model/kernels' code paths this CPU runs, and which it can.

The kernels come in four paths (model/kernels/isa.mojo), chosen per op call
at compile time:

    avx512-vnni      64-byte vectors, 8-bit dot products with vpdpbusd
    avx512-vnni-256  the same instructions on 32-byte vectors
    avx2             32-byte vectors, 8-bit dot products with vpmaddubsw + vpmaddwd
    portable         plain vector arithmetic, any CPU MAX runs on

Each op takes two: one for its one-input-row tile (a batch-1 decode step)
and one for several rows. ``auto`` (the default) lets the kernels pick from
MAX's compile target, the CPU at hand, for both, except on a
microarchitecture listed in ONE_ROW, whose one-row tiles were measured to
decode faster another way: per op, on another path, and for q4_0 without its
software prefetch (docs/cpu.md). ``GPT2_MAX_KERNEL_PATH=avx2`` (or a Linear's ``path=``)
forces one path for both: the tests run every path this CPU can execute
against numpy, so a machine with AVX-512 also checks the code an AVX2-only
CPU runs. A path the CPU cannot execute is refused here with one line
naming the missing feature (running it would stop on an illegal
instruction).

q4_0's weights are packed in bands of rows whose height MAX's own Q4_0
kernel fixes per target (twice its float32 vector width: 32 rows with
AVX-512, 16 with AVX2, 8 on Arm); ``q4_0_band()`` says which, and the op
reads any of them (it calls MAX's kernel only for the band that kernel reads).

Both follow the CPU the kernels are compiled for: this one, unless MAX was
told to compile for another (``max.driver.set_virtual_cpu_target``, as
maintain/targets.py does); then ``compiled_for()`` reads that target's
architecture and features from its name.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from dataclasses import dataclass

from artifacts.targets import cpu_features
from artifacts.targets import host_features as flags  # this CPU's features, archspec's reading
from model.errors import DeviceError

ENV = "GPT2_MAX_KERNEL_PATH"
# The op parameter each path passes (model/kernels/isa.mojo's AUTO, AVX512_VNNI, AVX2, PORTABLE).
PATHS = {"auto": 0, "avx512-vnni": 1, "avx2": 2, "portable": 3, "avx512-vnni-256": 4}
# What each forced path executes, as /proc/cpuinfo names the features.
_VNNI = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
NEEDS = {"avx512-vnni": _VNNI, "avx512-vnni-256": _VNNI, "avx2": ("avx2", "fma"), "portable": ()}
OPS = ("f32", "q8_0", "q4_0")  # model/kernels' ops, few_rows_matmul_<op>
# Groups of 32 weights ahead that the q4_0 op prefetches its weight stream
# (its ``ahead`` parameter) where ONE_ROW does not turn that off.
Q4_0_AHEAD = 8


@dataclass(frozen=True)
class OneRow:
    """How an op's one-input-row tile runs on a microarchitecture: its kernel
    path, and (q4_0) whether it prefetches its weights in software ahead of
    the hardware prefetcher."""

    path: str
    prefetch: bool = True


# Per microarchitecture (archspec's names) and op, the one-input-row tile
# where its batch-1 decode measured faster than on the CPU's own path with
# software prefetch; several rows keep their own path (docs/cpu.md, "Per
# microarchitecture"; docs/decisions/0009).
ONE_ROW = {"zen4": {"f32": OneRow("avx512-vnni-256"), "q8_0": OneRow("avx512-vnni-256"),
                    "q4_0": OneRow("avx512-vnni", prefetch=False)}}
# AMD's cores by CPU family and model, for when archspec names only the
# x86-64 level (microarchitecture()).
AMD_CORES = ((23, range(0x00, 0x30), "zen"), (23, range(0x30, 0x100), "zen2"),
             (25, range(0x00, 0x10), "zen3"), (25, range(0x10, 0x20), "zen4"), (25, range(0x20, 0x60), "zen3"),
             (25, range(0x60, 0x80), "zen4"), (25, range(0xa0, 0xb0), "zen4"), (26, range(0x00, 0x100), "zen5"))


class KernelPathError(DeviceError):
    """A kernel path this CPU cannot execute; one line for the user."""


@functools.cache
def cpuinfo() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo (empty where there is none): its vendor, family and
    model, which archspec does not hand out, for ``microarchitecture``. Its features: ``flags``."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


@functools.cache
def microarchitecture() -> str:
    """This CPU's microarchitecture as archspec names it ("zen4",
    "sapphirerapids", "neoverse_n1", or an x86-64 level). archspec tells
    them by their features; a hypervisor may hide one it looks for (pku,
    flush_l1d), and it then answers the x86-64 level: an AMD core is then
    named by its CPU family and model."""
    import archspec.cpu

    host = archspec.cpu.host()
    info = cpuinfo()
    if host.vendor != "generic" or info.get("vendor_id") != "AuthenticAMD":
        return host.name
    try:
        family, model = int(info["cpu family"]), int(info["model"])
    except (KeyError, ValueError):
        return host.name
    return next((name for fam, models, name in AMD_CORES if fam == family and model in models), host.name)


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


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
    """(is it x86-64, its features as /proc/cpuinfo names them) for a virtual
    CPU target: MAX's descriptor or a CPU's name, read by archspec
    (artifacts/targets.py's ``cpu_features``)."""
    machine, features = cpu_features(target)
    return machine == "x86_64", features


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


@dataclass(frozen=True)
class OpPaths:
    """The kernel paths an op is compiled with: ``one_row`` for its tile of
    one input row (batch-1 decode), ``rows`` for several; ``prefetch``:
    whether q4_0's tiles prefetch their weights in software."""

    one_row: str
    rows: str
    prefetch: bool = True

    def parameters(self, op: str = "f32") -> dict[str, int]:
        """The compile-time parameters of ``few_rows_matmul_<op>``: isa.mojo's
        ``isa1`` and ``isa``; q4_0's also its band and how far ahead it prefetches."""
        parameters = {"isa1": PATHS[self.one_row], "isa": PATHS[self.rows]}
        if op == "q4_0":
            parameters.update(band=q4_0_band(), ahead=q4_0_ahead(self.prefetch))
        return parameters

    def resolved(self) -> OpPaths:
        """The same paths with ``auto`` named (what the kernels compile)."""
        name = lambda path: native_path() if path == "auto" else path  # noqa: E731
        return OpPaths(one_row=name(self.one_row), rows=name(self.rows), prefetch=self.prefetch)


def op_paths(path: str | None = None, op: str = "f32") -> OpPaths:
    """The paths of ``few_rows_matmul_<op>`` for ``path`` (as kernel_path()
    takes it): a forced path for both shapes, with software prefetch; ``auto``
    the CPU's own for both, or, when the graph is compiled for this CPU, its
    ONE_ROW entry for one input row."""
    chosen = kernel_path(path)
    if chosen != "auto":
        return OpPaths(one_row=chosen, rows=chosen)
    tile = one_row_tile(op)
    return OpPaths(one_row=tile.path, rows=chosen, prefetch=tile.prefetch)


def op_parameters(op: str, path: str | None = None) -> dict[str, int]:
    """The compile-time parameters ``few_rows_matmul_<op>`` is called with for ``path`` (op_paths)."""
    return op_paths(path, op).parameters(op)


def q4_0_ahead(prefetch: bool) -> int:
    """The q4_0 op's ``ahead`` parameter: Q4_0_AHEAD groups, or 0 (no software prefetch)."""
    return Q4_0_AHEAD if prefetch else 0


# Set while this process builds graphs as they are shipped for other CPUs
# (as_shipped, run_as_shipped): a process-wide flag, since MAX may build a
# graph on a thread of its own.
_as_shipped = False


@contextlib.contextmanager
def as_shipped():
    """Within it ``auto`` means the CPU's own path for every shape, as in a
    graph compiled for other CPUs (a virtual target): what model/graph_source.py
    traces on this machine to compare with a graph shipped for them."""
    global _as_shipped
    before, _as_shipped = _as_shipped, True
    try:
        yield
    finally:
        _as_shipped = before


def run_as_shipped() -> None:
    """as_shipped() for the rest of this process: a server's engine that
    runs the graphs shipped for other CPUs builds the graphs they hold."""
    global _as_shipped
    _as_shipped = True


def one_row_tiles() -> dict[str, OneRow]:
    """What ``auto`` runs for one input row on the CPU compiled for, per op:
    this microarchitecture's ONE_ROW entry; empty where it has none, or where
    the graph is compiled for other CPUs (their own paths, with prefetch)."""
    if virtual_target() or _as_shipped:
        return {}
    return ONE_ROW.get(microarchitecture(), {})


def one_row_tile(op: str) -> OneRow:
    """``op``'s one-input-row tile under ``auto`` (one_row_tiles), else the CPU's own path, with prefetch."""
    return one_row_tiles().get(op, OneRow("auto"))


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


def describe_tiles(tiles: dict[str, OneRow]) -> str:
    """Per op its one-row tile in a few words: "q8_0 avx512-vnni-256, q4_0 avx512-vnni without prefetch"."""
    return ", ".join(f"{op} {tile.path}" + ("" if tile.prefetch else " without prefetch") for op, tile in tiles.items())


def describe() -> str:
    """One line for logs and saved graphs' names: the kernel path and q4_0
    band of the CPU compiled for, each op's one-row tile where ``auto`` runs
    another (ONE_ROW), and the target's name when it is not this CPU."""
    target = virtual_target()
    tiles = one_row_tiles()
    return (f"{platform.machine()} {native_path()} q4_0-band-{q4_0_band()}"
            + (f" one-row {describe_tiles(tiles)} ({microarchitecture()})" if tiles else "")
            + (f" target {target}" if target else ""))
