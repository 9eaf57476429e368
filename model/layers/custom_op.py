"""How a Linear layer calls one of model/kernels' Mojo ops, and the library they are compiled into.

The ops (model/kernels: ``few_rows_matmul_f32``, ``_q8_0``, ``_q4_0``) are
registered custom ops, called from the graph with ``F.custom``. Each is one
call per layer, so MAX fuses the bias add (and c_fc's gelu) into its output.
Each takes its kernel paths as compile-time parameters (model/cpu.py,
docs/cpu.md). ``KernelLinear`` is the layer around such a call; the kinds
(few_rows.py, q8_0.py, q4_0.py) say which op and which arrays.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from max.dtype import DType
from max.experimental import functional as F
from max.experimental import nn
from max.experimental.tensor import Tensor
from max.graph import DeviceRef, TensorType

from artifacts.files import files_digest
from model import caches, cpu

KERNELS = Path(__file__).resolve().parent.parent / "kernels"  # the Mojo package: kernel_library() compiles it (~2 s)


def custom_matmul(name: str, x, weights: list, out_dim: int, parameters: dict):
    """Call one of model/kernels' ops on ``x`` [..., in]: flattened to
    [rows, in] for the op, the float32 result reshaped back to ``x``'s
    leading shape and ``out_dim`` columns. ``parameters``: the op's
    compile-time parameters (``isa1`` and ``isa``, the kernel paths for one
    input row and for several: model/cpu.py; q4_0's ``band`` and ``ahead``).
    The call names the compiled library, so any graph (the app's, the
    server's, a test's) that uses the op can be compiled as it is."""
    lead = list(x.shape[:-1])
    x2 = x.reshape([-1, x.shape[-1]])
    out_type = TensorType(DType.float32, [x2.shape[0], out_dim], device=DeviceRef.CPU())
    y = F.custom(name, DeviceRef.CPU(), [x2, *weights], [out_type], parameters=parameters,
                 custom_extensions=[kernel_library()])[0]
    return y.reshape([*lead, out_dim])


class Traced:
    """Whether a layer was traced into the graph (a holder MAX's module tree
    does not look inside). What the app reports as quantized is what ran."""

    ran: bool = False


class KernelLinear(nn.Module):
    """A Linear whose product is one call of model/kernels' op ``op`` on the
    arrays named in ``arrays`` (in the op's order); the bias stays float32.
    ``path``: the kernel path (model/cpu.py; default ``$GPT2_MAX_KERNEL_PATH``
    or auto)."""

    op: str
    arrays: tuple[str, ...]

    def __init__(self, out_dim: int, bias: bool, path: str | None) -> None:
        super().__init__()
        self.out_features = out_dim
        self.bias = Tensor.zeros([out_dim]) if bias else None
        self.traced = Traced()
        self.parameters_of_op = cpu.op_parameters(self.op.removeprefix("few_rows_matmul_"), path)

    def forward(self, x):
        self.traced.ran = True
        y = custom_matmul(self.op, x, [getattr(self, name) for name in self.arrays], self.out_features,
                          self.parameters_of_op)
        return y if self.bias is None else y + self.bias


def kernel_library() -> Path:
    """model/kernels compiled into a Mojo library (.mojoc), once per version
    of its sources and of MAX, kept in the project's cache folder
    (model/caches.py).

    Why: handed the source folder, MAX runs ``mojo precompile`` on it (~2 s
    here) at every session and every call that names it: 30-47 s of every
    start for a model's ~50 calls. Handed a .mojoc, it loads it once."""
    return mojo_library(KERNELS)


def mojo_library(package: Path) -> Path:
    """``package`` (a folder of Mojo files) compiled into a library named by
    the digest of MAX's version and its sources, in the cache folder's
    ``kernels/``. Built once: the same path every run is also what lets MAX's
    cache find a graph compiled with it before."""
    digest = files_digest(sorted(package.glob("*.mojo")), package, seed=importlib.metadata.version("max"))
    library = caches.folder("kernels") / f"{package.name}_{digest[:20]}.mojoc"
    return precompile(package, library)


def precompile(package: Path, library: Path) -> Path:
    """``mojo precompile package -o library``, built under the library's final
    file name (the compiler takes the module's name from it), once
    (caches.made_once). (bench/kernels.py builds an older tree's this way too.)"""
    return caches.made_once(library, lambda staging: run_mojo("precompile", str(package), "-o", str(staging)))


def run_mojo(*args: str) -> None:
    """``mojo ARGS`` with the compiler that ships in the max wheel; what it
    printed to stderr raised when it fails."""
    from mojo.run import subprocess_run_mojo

    done = subprocess_run_mojo(list(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mojo {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr}")
