"""Step 11: the language-model head, ``GPT2LMHeadModel``.

What
    ``GPT2Model`` (named ``transformer``, as in Hugging Face) followed by the
    LM head ``lm_head``: a score (logit) for every vocabulary token at every
    position,

        logits = lm_head(hidden) = hidden @ lm_head.weight^T      [batch, seq, vocab_size]

    ``lm_head`` is a Linear layer from n_embd to vocab_size with no bias,
    made by ``linear`` like every other Linear (see step 04).

Why
    The head turns the last vector of each position back into "which token
    comes next". GPT-2 *ties* it to the token embedding: ``lm_head.weight``
    is the same ``[vocab_size, n_embd]`` table that reads tokens in (step
    05), which saves 38M parameters in the 124M model and is why GPT-2
    checkpoints may omit ``lm_head.weight``. The tie is made when the
    weights are loaded (``weights/`` hands the one wte table to both names),
    as Hugging Face's ``tie_weights`` does; the module itself is a plain
    Linear, so the app can build it quantized like the others.

    ``positions`` picks the positions to score, as an int64 tensor of indices
    into the sequence (None: all of them). Generation needs only the last one
    (``positions = [seq - 1]``), and the head is the single largest matmul of
    the model (nanoGPT scores only the last position at inference too).
    Picking rows by index is a gather, as the embedding of step 05 was; here
    along the sequence axis: ``F.gather(hidden, positions, axis=1)``.

Coming from PyTorch? docs/pytorch-to-max.md#linear-layers, docs/pytorch-to-max.md#eager-and-compiled

Check your work with ``pixi run s11`` (without pixi: ``python3.13 tasks.py s11``).
"""

from max.experimental import functional as F
from max.experimental import nn
from max.experimental.tensor import Tensor

from solutions.solution_01 import GPT2Config
from solutions.solution_07 import GPT2MultiHeadAttention
from solutions.solution_10 import GPT2Model


class GPT2LMHeadModel(nn.Module):
    """GPT-2 with its (tied) language-model head."""

    def __init__(self, config: GPT2Config, linear=nn.Linear, attention=GPT2MultiHeadAttention) -> None:
        super().__init__()
        self.config = config
        # transformer: GPT2Model, given ``linear`` and ``attention``;
        # lm_head: linear(n_embd, vocab_size) without bias.
        # BEGIN SOLUTION
        self.transformer = GPT2Model(config, linear, attention)
        self.lm_head = linear(config.n_embd, config.vocab_size, bias=False)
        # END SOLUTION

    def forward(self, ids: Tensor, caches: list | None = None, positions: Tensor | None = None) -> Tensor:
        """ids [batch, seq] -> logits [batch, len(positions) or seq, vocab_size]; ``caches`` as in step 10."""
        # BEGIN SOLUTION
        hidden = self.transformer(ids, caches)
        if positions is not None:
            hidden = F.gather(hidden, positions, axis=1)
        return self.lm_head(hidden)
        # END SOLUTION
