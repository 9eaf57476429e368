"""Q8_0 weights on this project's op (model/kernels/matmul.mojo), any number of rows.

MAX has no 8-bit matmul that keeps float32 results. The op rounds the
activations to Q8_0 too (8 bits per block of 32, as llama.cpp's q8_0 does)
and does integer dot products; for a prompt on a CPU without AVX-512 VNNI
(more than 32 rows on AVX2, 16 on the portable path: matmul.mojo's
``q8_0_dequantize_above``) it runs MAX's float32 matmul on the weights
dequantized inside the op instead.
The format and the tile layout are model/quantize.py's (``interleave_q8_0``).
"""

from __future__ import annotations

from max.dtype import DType
from max.experimental.tensor import Tensor

from model.layers.custom_op import KernelLinear
from model.quantize import BLOCK, Q8_0_TILE


class Q8_0Linear(KernelLinear):
    """Q8_0 in tiles of 8 rows (``interleave_q8_0``): ``weight`` int8
    codes [tiles, in * 8], ``scales`` [tiles, in / 4] float16 bits as uint16
    (the layout's, see interleave_q8_0);
    y = x @ (codes * scales)^T + b."""

    op, encoding, arrays = "few_rows_matmul_q8_0", "q8_0", ("weight", "scales")

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, path: str | None = None) -> None:
        super().__init__(out_dim, bias, path)
        tiles = -(-out_dim // Q8_0_TILE)
        self.weight = Tensor.zeros([tiles, in_dim * Q8_0_TILE], dtype=DType.int8)
        self.scales = Tensor.zeros([tiles, in_dim * Q8_0_TILE // BLOCK], dtype=DType.uint16)
