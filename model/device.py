"""Where the model runs and in which precision.

``--device auto`` takes an accelerator when MAX sees one, else the CPU.
``--dtype auto`` is float32 on the CPU and on a GPU. bfloat16, a GPU's fast
precision, is refused on a GPU under a MAX release known to compute it wrong:
MAX 26.7's bfloat16 matmuls gave wrong results on an H200 and an H100 where
several rows go through at once (a prompt's tokens, a batch's sequences) while
one row at a time was right (modular/modular#6883; docs/gpu.md,
docs/decisions/0011-bfloat16-refused-on-faulty-max.md). A release not in
BFLOAT16_FAULTY_MAX runs it, and tests/test_gpu.py's probes say whether it is
right there. bfloat16 on the CPU is refused: MAX 26.7 fuses GPT-2's layer
norm into a CPU kernel that fails to compile in bf16 (its epsilon must be
float32), and CPUs without AVX512-BF16 ran bf16 matmuls 5x slower than fp32.
``--dtype q8_0``, ``q6_k``, ``q4_0`` and ``q4_0m`` are the CPU's reduced precisions
instead: 8-, 6- or 4-bit weights (GGUF Q8_0 / Q6_K / Q4_0, see
model/quantize.py) with float32 activations, CPU only. Every precision runs
right on every x86-64 CPU (AVX-512 or AVX2 only) and compiles for Arm: the kernels
pick their instructions from the CPU (model/cpu.py), and a kernel path
forced with ``GPT2_MAX_KERNEL_PATH`` that the CPU cannot execute is refused
with one line naming the missing feature.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from model.errors import DeviceError

DEVICES = ("auto", "cpu", "gpu")
# The encodings of model/quantize.py; q4_0m is llama.cpp's Q4_0 mixture: a
# Q4_0 body with the tied head in Q6_K (model/layers/__init__.py).
QUANTIZED_DTYPES = ("q8_0", "q6_k", "q4_0", "q4_0m")
DTYPES = ("auto", "float32", "bfloat16", *QUANTIZED_DTYPES)


@dataclass(frozen=True)
class Placement:
    kind: str  # "cpu" or "gpu"
    dtype: str  # "float32", "bfloat16", or one of QUANTIZED_DTYPES (quantized weights, float32 activations)

    def max_device(self):
        from max.driver import CPU, Accelerator

        return Accelerator() if self.kind == "gpu" else CPU()

    def max_dtype(self):
        from max.dtype import DType

        return DType.bfloat16 if self.dtype == "bfloat16" else DType.float32

    @property
    def quantization(self) -> str | None:
        """The block encoding of the Linear layers' weights (activations stay
        float32), or None for plain float weights."""
        return self.dtype if self.dtype in QUANTIZED_DTYPES else None


# What hides GPUs from a process: NVIDIA's driver reads the first, AMD's runtimes the others.
GPU_VISIBILITY = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def hide_gpus() -> None:
    """Hide the GPUs from this process and its children, before MAX first looks
    for devices (MAX then counts none: ``--device auto`` takes the CPU, and
    MAX's eager ops run on the CPU). Each variable is set empty, not "-1": with
    "-1", MAX 26.7 still counted a GPU, then failed to open it when a graph
    was made (docs/gpu.md)."""
    for name in GPU_VISIBILITY:
        os.environ[name] = ""


def accelerator_count() -> int:
    """How many accelerators MAX can use (0 when none, or when asking fails)."""
    try:
        from max.driver import accelerator_count as count

        return int(count())
    except Exception:
        return 0


def apple_gpu_untried() -> bool:
    """On macOS: no Apple GPU has run this project's graph yet, and MAX 26.7
    cannot compile for one without it ("Metal virtual device mode not yet
    implemented"), so ``auto`` takes the CPU there, as Modular's own GPT-2
    course (max-llm-book) does on macOS."""
    return sys.platform == "darwin"


def auto_note(device: str) -> str | None:
    """A line for the user when ``--device auto`` passed over a GPU, else None."""
    if device == "auto" and apple_gpu_untried():
        return ("--device auto takes the CPU on macOS: no Apple GPU has run this graph yet "
                "(--device gpu tries it; docs/platforms.md)")
    return None


# What ``--dtype auto`` runs on each kind of device, and what the server and
# CI's GPU compile use: float32 on a GPU too (bfloat16_fault says why).
AUTO_DTYPE = {"cpu": "float32", "gpu": "float32"}

# The MAX releases (major.minor) whose bfloat16 matmuls on a GPU give wrong results wherever
# several rows go through at once: bfloat16 is refused on a GPU under them. Another release is
# let through, and `pixi run test-gpu`'s probes (tests/test_gpu.py) fail there if it is wrong too.
BFLOAT16_FAULTY_MAX = ("26.7",)
BFLOAT16_FAULT = "modular/modular#6883"  # MAX's issue: bfloat16 matmuls wrong at several rows


def bfloat16_fault(max_version: str | None = None) -> str | None:
    """Why a GPU refuses bfloat16 under MAX ``max_version`` (default: the
    installed one), in one line; None where that release is not known to
    compute it wrong."""
    if max_version is None:
        from artifacts.facts import max_version as installed

        max_version = installed()
    release = ".".join(max_version.split(".")[:2])
    if release not in BFLOAT16_FAULTY_MAX:
        return None
    return (f"--dtype bfloat16 is refused on a GPU under MAX {max_version}: its bfloat16 matmuls give wrong "
            f"results where several rows go through at once ({BFLOAT16_FAULT}); use float32 (docs/gpu.md)")


def choose(device: str = "auto", dtype: str = "auto", accelerators: int | None = None) -> Placement:
    """Resolve ``--device`` and ``--dtype`` into a concrete placement."""
    if device not in DEVICES:
        raise DeviceError(f"--device {device!r}: choose one of {', '.join(DEVICES)}")
    if dtype not in DTYPES:
        raise DeviceError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if device == "auto" and apple_gpu_untried():
        accelerators = 0  # the CPU until a Mac's GPU has run this graph (auto_note says so)
    if accelerators is None:
        accelerators = accelerator_count() if device != "cpu" else 0
    if device == "gpu" and accelerators == 0:
        raise DeviceError("--device gpu: MAX sees no accelerator on this machine (use --device cpu or auto)")
    kind = "gpu" if device == "gpu" or (device == "auto" and accelerators > 0) else "cpu"
    if kind == "cpu" and dtype == "bfloat16":
        raise DeviceError("--dtype bfloat16 runs on a GPU only; on the CPU use float32, q8_0, q6_k, q4_0 or q4_0m "
                          "(MAX 26.7's CPU layer norm does not compile in bf16)")
    if kind == "gpu" and dtype == "bfloat16" and (fault := bfloat16_fault()):
        raise DeviceError(fault)
    if kind == "gpu" and dtype in QUANTIZED_DTYPES:
        on_gpu = "float32" if bfloat16_fault() else "bfloat16 or float32"
        raise DeviceError(f"--dtype {dtype} runs on the CPU only (MAX 26.7's quantized matmuls and this project's "
                          f"Q8_0 kernel are CPU code); on a GPU use {on_gpu}")
    if dtype == "auto":
        dtype = AUTO_DTYPE[kind]
    if kind == "cpu":
        from model.cpu import kernel_path

        kernel_path()  # a forced kernel path ($GPT2_MAX_KERNEL_PATH) this CPU cannot execute is refused here
    return Placement(kind, dtype)
