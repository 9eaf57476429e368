"""GGUF blocks on MAX's own ``F.qmatmul`` (the app's q6_k).

MAX 26.7 ships quantized matmuls for GGUF's Q4_0, Q4_K and Q6_K on the CPU;
this layer hands them the blocks as they are (model/quantize.py's
``quantize_q6_k``). Output rows are padded to a multiple of 32 and the
padded columns cut off after.
"""

from __future__ import annotations

from max.dtype import DType
from max.experimental import functional as F
from max.experimental import nn
from max.experimental.tensor import Tensor
from max.graph.quantization import QuantizationEncoding

from model.layers.custom_op import Traced
from model.quantize import ENCODINGS, padded_rows


class QMatmulLinear(nn.Module):
    """A Linear whose weight is GGUF blocks: y = x @ dequantize(W)^T + b.

    Built like ``nn.Linear(in_dim, out_dim, bias)`` with the encoding first;
    its ``weight`` is [padded out rows, in_dim / block * block bytes] uint8,
    filled by model/quantize.py's ``quantize_state``."""

    arrays = ("weight",)  # what quantize_state fills (the bias stays float32)

    def __init__(self, encoding: str, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        fmt = ENCODINGS[encoding]
        self.encoding = encoding
        self.out_features = out_dim
        self.weight = Tensor.zeros([padded_rows(out_dim), in_dim // fmt.block * fmt.block_bytes], dtype=DType.uint8)
        self.bias = Tensor.zeros([out_dim]) if bias else None
        self.traced = Traced()

    def forward(self, x):
        self.traced.ran = True
        y = F.qmatmul(QuantizationEncoding[ENCODINGS[self.encoding].max_name], None, x, self.weight)
        if self.out_features != self.weight.shape[0]:
            y = y[..., : self.out_features]
        return y if self.bias is None else y + self.bias
