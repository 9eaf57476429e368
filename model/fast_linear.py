"""The app's Linear layer on the CPU: this project's Mojo kernels for few rows.

Why: decoding one token reads every weight once, so its speed is the rate at
which the weights stream from memory, and MAX 26.7's CPU matmul tiles and
packs W at run time for a one-row product, far from that rate.
``model/kernels/matmul.mojo`` reads W once, in the checkpoint's own [out, in]
layout (``python -m bench.kernels`` measures both). For many rows (a long
prompt) MAX's tiled matmul is the better kernel, so the float32 op asks how
many rows it got:

    rows <= FEW_ROWS   its own tiles (decode, small batches, short prompts)
    rows >  FEW_ROWS   MAX's CPU matmul (MatmulCPU, what ``x @ W.T`` runs),
                       called from inside the op

The choice is made inside the op, not by an ``F.cond`` in the graph, so
that MAX fuses the bias add (and c_fc's gelu) into the op's output instead
of running each as a kernel of its own. The Q8_0 and Q4_0 ops
(model/quantize.py) are one call per layer too. Each op takes the kernel
path as a compile-time parameter (model/cpu.py, docs/cpu.md). The figures
behind these choices are in docs/journal.md ("Kernels: from the code's comments").

The weights, their names ("weight" [out, in], "bias" [out]) and the results
are the course's nn.Linear's (tests/test_fast_linear.py compares them, and
the tokens of whole models built both ways).

``few_rows_linear`` is the course's ``linear`` maker (steps 04, 07, 11 take
one), used by ``load_gpt2`` for float32 on the CPU (``linear="custom"``,
the default; ``--linear course`` builds step 04's nn.Linear instead). The
kernels are CPU code: on a GPU nn.Linear runs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

KERNELS = Path(__file__).resolve().parent / "kernels"  # the Mojo package: kernel_library() compiles it (~2 s)
LINEARS = ("course", "custom")  # load_gpt2's linear= / --linear: step 04's nn.Linear, or this file's
FEW_ROWS = 16  # the kernels' own FEW_ROWS (matmul.mojo)


def custom_matmul(name: str, x, weights: list, out_dim: int, parameters: dict):
    """Call one of model/kernels' ops on ``x`` [..., in]: flattened to
    [rows, in] for the op, the float32 result reshaped back to ``x``'s
    leading shape and ``out_dim`` columns. ``parameters``: the op's
    compile-time parameters (``isa``, the kernel path: model/cpu.py; q4_0's
    ``band``). The call names the compiled library, so any graph (the
    app's, the server's, a test's) that uses the op can be compiled as it is."""
    from max.dtype import DType
    from max.experimental import functional as F
    from max.graph import DeviceRef, TensorType

    lead = list(x.shape[:-1])
    x2 = x.reshape([-1, x.shape[-1]])
    out_type = TensorType(DType.float32, [x2.shape[0], out_dim], device=DeviceRef.CPU())
    y = F.custom(name, DeviceRef.CPU(), [x2, *weights], [out_type], parameters=parameters,
                 custom_extensions=[kernel_library()])[0]
    return y.reshape([*lead, out_dim])


def kernel_library() -> Path:
    """model/kernels compiled into a Mojo library (.mojoc), once per version
    of its sources and of MAX, kept in this project's cache folder.

    Why: handed the source folder, MAX runs ``mojo precompile`` on it (~2 s
    here) at every session and every call that names it: 30-47 s of every
    start for a model's ~50 calls. Handed a .mojoc, it loads it once."""
    from model.saved_graphs import cache_root

    digest = hashlib.sha256(importlib.metadata.version("max").encode())
    for path in sorted(KERNELS.glob("*.mojo")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    library = cache_root() / "kernels" / f"kernels_{digest.hexdigest()[:20]}.mojoc"
    if library.is_file():
        return library
    from mojo.run import subprocess_run_mojo

    # Built under its final file name (the compiler takes the library's
    # module name from it), in a folder of this process, then moved into
    # place: two processes building at once both succeed.
    library.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging.", dir=library.parent)) / library.name
    try:
        done = subprocess_run_mojo(["precompile", str(KERNELS), "-o", str(staging)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"mojo precompile {KERNELS} failed (exit {done.returncode}):\n{done.stderr}")
        os.replace(staging, library)
    finally:
        shutil.rmtree(staging.parent, ignore_errors=True)
    return library


@functools.cache
def few_rows_linear_class():
    """``FewRowsLinear``, defined on first use so that importing this file does not load MAX."""
    from max.experimental import nn
    from max.experimental.tensor import Tensor

    from model import cpu

    class FewRowsLinear(nn.Module):
        """``nn.Linear(in_dim, out_dim, bias)`` for the CPU in float32: one
        custom op, this project's GEMV tiles for few rows, MAX's matmul for
        many; the bias add is fused into it by MAX. ``path``: the kernel
        path (model/cpu.py; default ``$GPT2_MAX_KERNEL_PATH`` or auto)."""

        def __init__(self, in_dim: int, out_dim: int, bias: bool = True, path: str | None = None) -> None:
            super().__init__()
            self.out_features = out_dim
            self.weight = Tensor.zeros([out_dim, in_dim])
            self.bias = Tensor.zeros([out_dim]) if bias else None
            self.parameters_of_op = {"isa": cpu.PATHS[cpu.kernel_path(path)]}

        def forward(self, x):
            y = custom_matmul("few_rows_matmul_f32", x, [self.weight], self.out_features, self.parameters_of_op)
            return y if self.bias is None else y + self.bias

    return FewRowsLinear


def few_rows_linear(in_dim: int, out_dim: int, bias: bool = True):
    """The course's ``linear`` maker (see step 04), with the few-rows kernel."""
    return few_rows_linear_class()(in_dim, out_dim, bias)
