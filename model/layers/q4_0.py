"""Q4_0 weights on this project's op (model/kernels/q4_0.mojo).

The weights are in the layout MAX's own Q4_0 kernel reads (model/quantize.py's
``pack_q4_0``), in bands of rows whose height depends on the CPU
(docs/cpu.md): the op runs its own kernel for one row, MAX's
kernel for a prompt where the band is MAX's, and its own band kernel for
every row otherwise.
"""

from __future__ import annotations

from max.dtype import DType
from max.experimental.tensor import Tensor

from model import cpu
from model.layers.custom_op import KernelLinear
from model.quantize import BLOCK, BLOCK_BYTES, padded_rows


class Q4_0Linear(KernelLinear):
    """Q4_0 blocks in MAX's packed layout in bands of ``band`` rows (default:
    the band MAX's kernel reads on this CPU): ``weight`` uint8 [out rounded
    up to 32, in / 32 * 18]; y = x @ dequantize(W)^T + b; the padded rows
    are never outputs. ``prefetch``: whether the op prefetches its weights
    in software (default: model/cpu.py's choice for this CPU)."""

    op, encoding, arrays = "few_rows_matmul_q4_0", "q4_0", ("weight",)

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, path: str | None = None,
                 band: int | None = None, prefetch: bool | None = None) -> None:
        super().__init__(out_dim, bias, path)
        self.band = band or self.parameters_of_op["band"]
        self.parameters_of_op["band"] = self.band
        if prefetch is not None:
            self.parameters_of_op["ahead"] = cpu.q4_0_ahead(prefetch)
        self.weight = Tensor.zeros([padded_rows(out_dim), in_dim // BLOCK * BLOCK_BYTES], dtype=DType.uint8)
