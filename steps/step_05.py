"""Step 05: token embeddings, ``wte``.

What
    ``TokenEmbedding(vocab_size, n_embd)``: a learned table ``weight`` of shape
    ``[vocab_size, n_embd]``, one row per token id. ``forward(ids)`` looks the
    rows up: ids of shape ``[batch, seq]`` become vectors ``[batch, seq, n_embd]``.

Why
    The model cannot do arithmetic on token ids (id 995 " world" is not
    "bigger" than id 11 ","). Each id gets its own learned vector instead.
    GPT-2 calls this table ``wte`` ("word token embedding"), and reuses the same
    table at the very end to turn vectors back into scores over the vocabulary
    (step 11). Unlike the 2017 Transformer, GPT-2 does *not* multiply the
    embeddings by sqrt(n_embd).

The math
    out[b, t, :] = weight[ids[b, t], :]

    That is a gather along axis 0 of the table: the same as one-hot(ids) @ weight,
    without building the one-hot matrix.

Useful MAX calls
    ``F.gather(table, ids, axis=0)``; ``random.normal([rows, cols])`` from
    ``max.experimental.random`` for the initial table.

Coming from PyTorch? docs/pytorch-to-max.md#parameters, docs/pytorch-to-max.md#values-in-and-out

Check your work with ``pixi run s05`` (without pixi: ``python3.13 tasks.py s05``).
"""

from max.experimental import functional as F
from max.experimental import nn, random
from max.experimental.tensor import Tensor


class TokenEmbedding(nn.Module):
    """Learned vectors for token ids: GPT-2's ``wte``."""

    def __init__(self, vocab_size: int, n_embd: int) -> None:
        super().__init__()
        # The table, named `weight` as in checkpoints (wte.weight), one row per id.
        raise NotImplementedError("TODO(step 05): replace this line with your code")

    def forward(self, ids: Tensor) -> Tensor:
        # Look up one row of the table per id.
        raise NotImplementedError("TODO(step 05): replace this line with your code")
