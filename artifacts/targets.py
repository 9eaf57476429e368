"""The one table of targets: the CPU levels and GPU architectures the project compiles for.

The shipped artifacts are made for the ``shipped`` CPU levels; the targets
check (maintain/targets.py) compiles for every row. A CPU level's features
are archspec's for its microarchitecture (``uarch``), with ``extra`` ones
beyond it, spelled as Linux's /proc/cpuinfo spells them; whether this CPU
has them is archspec's reading of this machine (``host_features``).
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """One thing the project compiles for: a CPU level (``cpu``: MAX's virtual
    CPU target) or a GPU architecture (``gpu``: NVIDIA's name)."""

    name: str  # its name, and its folder's
    means: str  # the hardware, in words
    cpu: str = ""  # MAX's virtual CPU target, for a CPU target
    gpu: str = ""  # an NVIDIA architecture, for a GPU target
    path: str = ""  # the kernel path model/kernels/isa.mojo's auto takes there
    shipped: bool = False  # artifacts are shipped for it (CPU levels only)

    @property
    def machine(self) -> str:
        """The architecture of the CPUs it runs on, as Linux names it (x86_64, aarch64, arm64)."""
        return cpu_features(self.cpu)[0] if self.cpu else ""

    @property
    def system(self) -> str:
        return "Darwin" if "apple-darwin" in self.cpu else "Linux"

    def features(self) -> frozenset[str]:
        """The CPU features code compiled for it may use, as /proc/cpuinfo names them."""
        return cpu_features(self.cpu)[1] if self.cpu else frozenset()


TARGETS = {target.name: target for target in (
    Target("x86-64-v3", "x86-64 with AVX2 and FMA: Intel since Haswell, AMD since Excavator and every Zen",
           cpu="triple=x86_64-unknown-linux-gnu;cpu=x86-64-v3", path="avx2", shipped=True),
    Target("neoverse-n1", "Arm CPUs from Neoverse N1 on: AWS Graviton2 and later, Ampere Altra",
           cpu="triple=aarch64-unknown-linux-gnu;cpu=neoverse-n1", path="portable", shipped=True),
    Target("x86-64-v4-vnni", "x86-64 with AVX-512 and VNNI",
           cpu="triple=x86_64-unknown-linux-gnu;cpu=x86-64-v4;features=+avx512vnni", path="avx512-vnni"),
    Target("apple-m1", "Apple silicon's CPU (macOS)", cpu="triple=arm64-apple-darwin;cpu=apple-m1", path="portable"),
    Target("sm_90a", "NVIDIA H100 / H200 (Hopper)", gpu="sm_90a"),
    Target("sm_80", "NVIDIA A100 (Ampere)", gpu="sm_80"),
    Target("sm_89", "NVIDIA L4, RTX 40 series (Ada)", gpu="sm_89"),
)}
SHIPPED = {name: target for name, target in TARGETS.items() if target.shipped}


# LLVM's spelling of a feature where Linux's (and so archspec's) differs.
LINUX_SPELLING = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "sse4.2": "sse4_2", "avxvnni": "avx_vnni"}


@functools.cache
def cpu_features(descriptor: str) -> tuple[str, frozenset[str]]:
    """(architecture, features as /proc/cpuinfo names them) of the CPU a MAX descriptor names
    (``triple=x86_64-unknown-linux-gnu;cpu=x86-64-v4;features=+avx512vnni``, or a bare CPU name):
    the features archspec knows for that CPU (LLVM's x86-64-v3 is archspec's x86_64_v3, apple-m1
    its m1), with the descriptor's own changes. A CPU archspec does not know is refused, not guessed."""
    import archspec.cpu

    parts = [part.strip() for part in descriptor.split(";") if part.strip()]
    fields = dict(part.split("=", 1) if "=" in part else ("cpu", part) for part in parts)
    name = fields.get("cpu", "").strip()
    known = archspec.cpu.TARGETS.get(name.removeprefix("apple-").replace("-", "_"))
    if known is None:
        raise ValueError(f"CPU target {descriptor!r}: archspec does not know the CPU {name!r}")
    machine = fields["triple"].split("-")[0] if "triple" in fields else str(known.family)
    changes = [f.strip() for f in fields.get("features", fields.get("feature", "")).split(",") if f.strip()]
    spelled = lambda change: LINUX_SPELLING.get(change[1:], change[1:])  # noqa: E731
    features = set(known.features) | {spelled(c) for c in changes if c.startswith("+")}
    return machine, frozenset(features - {spelled(c) for c in changes if c.startswith("-")})


def compile_for(target: Target, compile_only: bool) -> None:
    """Make this process compile for ``target``, before its first device (the settings are MAX's,
    process-wide): MAX's virtual CPU target, and with ``compile_only`` MAX's virtual-device mode
    too, in which a compile returns a model that is never initialised here (a GPU's code, or a
    CPU's this machine may not run). Without it the process runs what it compiles (the server's
    engine making its graphs) or only exports it (MAX's eager kernels, whose sweeps would take in
    a GPU in sight)."""
    from max import driver

    if compile_only:
        driver.set_virtual_device_api("cuda")
        driver.set_virtual_device_target_arch(target.gpu or "sm_90a")
        driver.set_virtual_device_count(1)
    if target.cpu:
        driver.set_virtual_cpu_target(target.cpu)


def host_machine() -> str:
    """This machine's architecture as the targets name theirs."""
    machine = platform.machine().lower()
    return "x86_64" if machine in ("x86_64", "amd64") else machine


@functools.cache
def host_features() -> frozenset[str]:
    """This CPU's features, as archspec reads them (/proc/cpuinfo on Linux); empty where it cannot."""
    import archspec.cpu.detect

    try:
        return frozenset(archspec.cpu.detect.detected_info().features)
    except Exception:  # archspec raises what its reader met: no features, then (nothing shipped runs)
        return frozenset()


def this_machines() -> Target | None:
    """The shipped level of this machine's system and architecture; None where none is."""
    return next((target for target in SHIPPED.values()
                 if (target.system, target.machine) == (platform.system(), host_machine())), None)
