"""Step 04: the feed-forward network, ``GPT2MLP``.

What
    Two linear layers with a GELU between them, applied to every position on
    its own:

        c_fc:   n_embd   -> 4 * n_embd      ("fully connected", widens)
        gelu_new                            (elementwise non-linearity)
        c_proj: 4 * n_embd -> n_embd        ("projection", back to the width)

Why
    Attention mixes information *between* positions; the MLP transforms each
    position's vector *on its own*, and holds about two thirds of GPT-2's
    parameters. The names ``c_fc`` and ``c_proj`` are the ones in GPT-2
    checkpoints (``h.0.mlp.c_fc.weight``), so pretrained weights load with no
    renaming.

The math
    GPT-2 uses the tanh approximation of GELU (Hugging Face calls it
    ``gelu_new``), not the exact erf form:

        gelu_new(x) = 0.5 * x * (1 + tanh( sqrt(2 / pi) * (x + 0.044715 * x^3) ))

    The two differ by up to ~1e-3: enough to be caught by a numeric check, and
    enough to drift pretrained outputs away from Hugging Face's.

Building the layers
    ``linear(in_dim, out_dim)`` makes a Linear layer (weight [out, in], bias
    [out]). It is ``nn.Linear`` unless the caller passes another maker with the
    same arguments: the app passes one that stores 4-bit weights
    (``--dtype q4_0``), which is how one model definition serves every
    precision. PyTorch code does the same (torchvision's ``norm_layer=``).

Useful MAX calls
    ``F.tanh``,
    ``x * x * x`` or ``x ** 3``, ``math.sqrt`` / ``math.pi`` for the constant.

Coming from PyTorch? docs/pytorch-to-max.md#linear-layers

Check your work with ``pixi run s04`` (without pixi: ``python3.13 tasks.py s04``).
"""

import math

from max.experimental import functional as F
from max.experimental import nn
from max.experimental.tensor import Tensor

from steps.step_01 import GPT2Config


def gelu_new(x: Tensor) -> Tensor:
    """GELU, tanh approximation (GPT-2's activation)."""
    raise NotImplementedError("TODO(step 04): replace this line with your code")


class GPT2MLP(nn.Module):
    """c_fc -> gelu_new -> c_proj, with Hugging Face's names."""

    def __init__(self, config: GPT2Config, linear=nn.Linear) -> None:
        super().__init__()
        # Two Linear layers with bias, made by ``linear`` (nn.Linear unless the
        # app asks for another kind, e.g. quantized): c_fc widens n_embd to
        # 4 * n_embd, c_proj brings it back.
        raise NotImplementedError("TODO(step 04): replace this line with your code")

    def forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError("TODO(step 04): replace this line with your code")
