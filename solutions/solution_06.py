"""Step 06: position embeddings, ``wpe``.

What
    ``PositionEmbedding(n_positions, n_embd)``: a learned table ``weight`` of
    shape ``[n_positions, n_embd]``, one row per position.
    ``forward(seq_len, past_len=0)`` returns the rows of positions
    ``past_len, ..., past_len + seq_len - 1``: shape ``[seq_len, n_embd]``.

Why
    Attention itself is blind to order: shuffle the tokens and each one gets
    the same mix. GPT-2 adds a learned vector per position to each token's
    embedding, so "dog bites man" and "man bites dog" differ. Positions are
    learned (not the 2017 sine waves), which is why GPT-2 cannot read past
    ``n_positions`` = 1024 tokens.

    With a KV cache (later) the model reads only the new tokens; the first new
    token sits at position ``past_len``, not 0. Getting this offset wrong gives
    output that looks fine for the prompt and degrades one token later.

The math
    out[t, :] = weight[past_len + t, :]      for t in 0 .. seq_len - 1

    The result broadcasts over the batch when added to the token embeddings
    ``[batch, seq_len, n_embd]``.

Useful MAX calls
    ``Tensor.arange(start, stop, dtype=DType.int64, device=self.weight.device)``
    and ``F.gather(table, positions, axis=0)``.

Coming from PyTorch? docs/pytorch-to-max.md#new-tensors-dtype-and-device

Check your work with ``pixi run s06`` (without pixi: ``python3.13 tasks.py s06``).
"""

from max.dtype import DType
from max.experimental import functional as F
from max.experimental import nn, random
from max.experimental.tensor import Tensor
from max.graph import DimLike


class PositionEmbedding(nn.Module):
    """Learned vectors for positions: GPT-2's ``wpe``."""

    def __init__(self, n_positions: int, n_embd: int) -> None:
        super().__init__()
        # BEGIN SOLUTION
        self.weight = random.normal([n_positions, n_embd])
        # END SOLUTION

    def forward(self, seq_len: DimLike, past_len: DimLike = 0) -> Tensor:
        # The rows for positions past_len .. past_len + seq_len - 1.
        # BEGIN SOLUTION
        positions = Tensor.arange(
            past_len, past_len + seq_len, dtype=DType.int64, device=self.weight.device
        )
        return F.gather(self.weight, positions, axis=0)
        # END SOLUTION
