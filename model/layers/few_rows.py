"""The app's float32 Linear on the CPU: this project's Mojo kernel for few rows.

Why: decoding one token reads every weight once, so its speed is the rate at
which the weights stream from memory, and MAX 26.7's CPU matmul tiles and
packs W at run time for a one-row product, far from that rate.
``model/kernels/matmul.mojo`` reads W once, in the checkpoint's own [out, in]
layout (``python -m bench.kernels`` measures both). For many rows (a long
prompt) MAX's tiled matmul is the better kernel, so the op asks how many
rows it got:

    rows <= FEW_ROWS   its own tiles (decode, small batches, short prompts)
    rows >  FEW_ROWS   MAX's CPU matmul (MatmulCPU, what ``x @ W.T`` runs),
                       called from inside the op

The choice is made inside the op, not by an ``F.cond`` in the graph, so
that MAX fuses the bias add (and c_fc's gelu) into the op's output. Why
kernels of the project's own: docs/decisions/0003-own-q8_0-q4_0-kernels.md.

The weights, their names ("weight" [out, in], "bias" [out]) and the results
are the course's nn.Linear's (tests/test_fast_linear.py compares them, and
the tokens of whole models built both ways). The kernels are CPU code: on a
GPU nn.Linear runs.
"""

from __future__ import annotations

from max.experimental.tensor import Tensor

from model.layers.custom_op import KernelLinear

FEW_ROWS = 16  # the kernels' own FEW_ROWS (matmul.mojo)


class FewRowsLinear(KernelLinear):
    """``nn.Linear(in_dim, out_dim, bias)`` for the CPU in float32: one
    custom op, this project's GEMV tiles for few rows, MAX's matmul for
    many; the bias add is fused into it by MAX."""

    op, arrays = "few_rows_matmul_f32", ("weight",)

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, path: str | None = None) -> None:
        super().__init__(out_dim, bias, path)
        self.weight = Tensor.zeros([out_dim, in_dim])
