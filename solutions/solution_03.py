"""Step 03: layer normalization.

What
    ``LayerNorm(dim, eps=1e-5)``: a module with a learned ``weight`` (scale,
    starts at 1) and ``bias`` (shift, starts at 0), both of shape ``[dim]``,
    that normalises each vector along its last axis.

Why
    Deep stacks of blocks train and run stably only if the activations keep a
    steady scale. Layer norm re-centres and re-scales each token's vector on
    its own (no statistics across the batch), then lets the model choose the
    scale and shift it prefers. GPT-2 applies one before attention, one before
    the MLP in every block, and one at the very end (``ln_f``). The parameter
    names ``weight`` and ``bias`` are the ones in GPT-2 checkpoints.

The math, over the last axis of x (n = dim features)
    mean = sum(x) / n
    var  = sum((x - mean)^2) / n          biased: divide by n, not n - 1
    y    = (x - mean) / sqrt(var + eps) * weight + bias

    eps = 1e-5 keeps the division finite when a vector is constant.

Useful MAX calls
    ``x.mean(axis=-1)`` keeps the reduced axis (size 1), so it broadcasts back
    against ``x``; ``F.sqrt``/``F.rsqrt``; ``Tensor.ones([dim])``/``Tensor.zeros``.
    (``F.layer_norm`` exists; write it from the formula here so you see it.)

Coming from PyTorch? docs/pytorch-to-max.md#parameters, docs/pytorch-to-max.md#new-tensors-dtype-and-device

Check your work with ``pixi run s03`` (without pixi: ``python3.13 tasks.py s03``).
"""

from max.experimental import functional as F
from max.experimental import nn
from max.experimental.tensor import Tensor


class LayerNorm(nn.Module):
    """Layer norm over the last axis with a learned scale and shift."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        # A learned scale of ones and a shift of zeros, each of shape [dim],
        # named exactly as in GPT-2 checkpoints. No dtype: parameters, like
        # nn.Linear's, take the dtype the model is built in (float32, or
        # bfloat16 on a GPU), docs/pytorch-to-max.md#new-tensors-dtype-and-device.
        # BEGIN SOLUTION
        self.weight = Tensor.ones([dim])
        self.bias = Tensor.zeros([dim])
        # END SOLUTION

    def forward(self, x: Tensor) -> Tensor:
        # Normalise over the last axis with the biased variance, add eps inside
        # the square root, then scale and shift.
        # BEGIN SOLUTION
        mean = x.mean(axis=-1)
        centered = x - mean
        var = (centered * centered).mean(axis=-1)
        return centered * F.rsqrt(var + self.eps) * self.weight + self.bias
        # END SOLUTION
