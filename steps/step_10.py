"""Step 10: the stacked model, ``GPT2Model``.

What
    Token ids in, one vector per position out:

        x = wte(ids) + wpe(seq, past)        [batch, seq, n_embd]
        for block in h:  x = block(x)        n_layer blocks
        return ln_f(x)

    with Hugging Face's names: ``wte``, ``wpe``, ``h`` (a list of blocks, so
    parameters read ``h.0.attn.c_attn.weight``, ``h.1...``) and ``ln_f``.

    What each part reads from the config: ``wte`` is ``vocab_size`` x
    ``n_embd``, ``wpe`` ``n_positions`` x ``n_embd``, ``h`` holds ``n_layer``
    blocks, and ``ln_f`` normalises ``n_embd`` wide with
    ``eps=config.layer_norm_epsilon``, as the blocks' norms do (a checkpoint
    may set another value than LayerNorm's default).

Why
    This is the whole transformer. ``ln_f`` is needed because of pre-LN
    (step 08): the residual stream is never normalised inside the stack, so
    it is normalised once at the end.

The cache
    ``forward(ids, caches)`` takes ``caches``, one cache per block (step 07's
    ConcatCache, or the app's; None: no cache), and hands block i its own.
    The positions of the new tokens start after the cached ones:
    ``past_len = caches[0].length``, read before the blocks add to them.
    ``new_caches(n_layer)`` makes the course's empty ones.

Useful MAX calls
    ``nn.ModuleList([...])`` holds the blocks (its children are named 0, 1, ...).

Coming from PyTorch? docs/pytorch-to-max.md#loading-weights, docs/pytorch-to-max.md#building-lazily

Check your work with ``pixi run s10`` (without pixi: ``python3.13 tasks.py s10``).
"""

from max.experimental import nn
from max.experimental.tensor import Tensor

from steps.step_01 import GPT2Config
from steps.step_03 import LayerNorm
from steps.step_05 import TokenEmbedding
from steps.step_06 import PositionEmbedding
from steps.step_07 import ConcatCache, GPT2MultiHeadAttention
from steps.step_09 import GPT2Block


def new_caches(n_layer: int) -> list[ConcatCache]:
    """One empty course cache per block."""
    return [ConcatCache() for _ in range(n_layer)]


class GPT2Model(nn.Module):
    """Embeddings, n_layer blocks and the final layer norm."""

    def __init__(self, config: GPT2Config, linear=nn.Linear, attention=GPT2MultiHeadAttention) -> None:
        super().__init__()
        self.config = config
        # Every block gets ``linear`` and ``attention`` (see step 09).
        raise NotImplementedError("TODO(step 10): replace this line with your code")

    def forward(self, ids: Tensor, caches: list | None = None) -> Tensor:
        """ids [batch, seq] -> hidden [batch, seq, n_embd]; ``caches``: one per block, or None."""
        raise NotImplementedError("TODO(step 10): replace this line with your code")
