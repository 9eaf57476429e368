"""Step 09: the transformer block, ``GPT2Block``.

What
    One of GPT-2's identical layers, wired pre-LN (step 08):

        x = x + attn(ln_1(x))       attention: positions read from each other
        x = x + mlp(ln_2(x))        MLP: each position thinks on its own

    with Hugging Face's names: ``ln_1``, ``attn``, ``ln_2``, ``mlp``. Pretrained
    weights then load straight in (``h.3.attn.c_attn.weight``, ``h.3.ln_2.bias``).

    What each part reads from the config: both norms are ``n_embd`` wide with
    ``eps=config.layer_norm_epsilon`` (not LayerNorm's default: a checkpoint
    may set another value); attention and the MLP take the whole config.

Why
    Everything GPT-2 does happens in 12 (to 48) repetitions of this block.
    The block hands its ``cache`` (this layer's keys and values, step 07) on
    to the attention; the MLP needs none.

Built from your earlier steps
    ``LayerNorm`` (03), ``GPT2MultiHeadAttention`` (07), ``GPT2MLP`` (04),
    ``pre_norm_residual`` (08). They are imported from your own step files, so
    the block runs on the code you wrote.

    ``linear`` and ``attention`` say which Linear layers and which attention
    class to build (by default nn.Linear and step 07's): pass them on, so
    that the app can build the same block with quantized layers, or with the
    attention of bonus step 15 that also keeps its probabilities.

Check your work with ``pixi run s09`` (without pixi: ``python3.13 tasks.py s09``).
"""

from max.experimental import nn
from max.experimental.tensor import Tensor

from steps.step_01 import GPT2Config
from steps.step_03 import LayerNorm
from steps.step_04 import GPT2MLP
from steps.step_07 import GPT2MultiHeadAttention
from steps.step_08 import pre_norm_residual


class GPT2Block(nn.Module):
    """ln_1 -> attn -> residual, ln_2 -> mlp -> residual."""

    def __init__(self, config: GPT2Config, linear=nn.Linear, attention=GPT2MultiHeadAttention) -> None:
        super().__init__()
        # Four children named as in GPT-2 checkpoints; both norms use
        # config.layer_norm_epsilon; attn = attention(config, linear) and the
        # MLP gets the same ``linear``.
        raise NotImplementedError("TODO(step 09): replace this line with your code")

    def forward(self, x: Tensor, cache=None) -> Tensor:
        """x [batch, seq, n_embd] after the block; ``cache`` goes to the attention."""
        # The attention's residual is written out by hand (its call takes the
        # cache too); the MLP's goes through pre_norm_residual.
        raise NotImplementedError("TODO(step 09): replace this line with your code")
