"""Step 11: the language-model head, ``GPT2LMHeadModel``.

What
    ``GPT2Model`` (named ``transformer``, as in Hugging Face) followed by the
    LM head: a score (logit) for every vocabulary token at every position,

        logits = hidden @ wte.weight^T          [batch, seq, vocab_size]

Why
    The head turns the last vector of each position back into "which token
    comes next". GPT-2 *ties* it to the token embedding: the same
    ``[vocab_size, n_embd]`` table reads tokens in (step 05) and scores them
    out, which saves 38M parameters in the 124M model and is why GPT-2
    checkpoints may omit ``lm_head.weight``. There is no bias.

    ``last_only=True`` scores only the last position: generation needs just
    that one, and the head is the single largest matmul of the model (nanoGPT
    does the same at inference).

Check your work with ``pixi run s11``.
"""

from max.experimental import nn
from max.experimental.tensor import Tensor

from solutions.solution_01 import GPT2Config
from solutions.solution_10 import GPT2Model, KVCache


class GPT2LMHeadModel(nn.Module):
    """GPT-2 with its tied language-model head."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        # BEGIN SOLUTION
        self.transformer = GPT2Model(config)
        # END SOLUTION

    def lm_head(self, hidden: Tensor) -> Tensor:
        """[..., n_embd] -> [..., vocab_size], with the tied wte table."""
        # BEGIN SOLUTION
        return hidden @ self.transformer.wte.weight.T
        # END SOLUTION

    def forward(
        self, ids: Tensor, past: KVCache | None = None, last_only: bool = False
    ) -> tuple[Tensor, KVCache]:
        """ids [batch, seq] -> (logits [batch, seq or 1, vocab_size], new cache)."""
        # BEGIN SOLUTION
        hidden, present = self.transformer(ids, past)
        if last_only:
            seq = hidden.shape[1]
            hidden = hidden[:, seq - 1 :, :]
        return self.lm_head(hidden), present
        # END SOLUTION
