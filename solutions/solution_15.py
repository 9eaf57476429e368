"""Bonus step 15: attention that can also return its probabilities.

What
    ``GPT2AttentionWithWeights``: step 07's attention (same parameters, same
    math, same output) whose forward can, when asked, also return the
    attention probabilities it used:

        forward(x, cache=None, return_weights=False)
            -> output                                    as in step 07
            -> (output, weights)                         with return_weights=True

    ``weights`` has shape (batch, n_head, seq, past + seq): row i of head h is
    the distribution query i spreads over the keys. Every row sums to 1, and
    under the causal mask every future key gets exactly 0.

Why
    Those probabilities are what attention-map pictures show (``pixi run
    attention-map`` builds GPT-2 with this class in every block). Returning
    them is opt-in because a (seq x seq) tensor per head and layer costs
    memory nobody needs while generating; by default the output is exactly
    step 07's.

How: reuse, do not repeat
    Step 07 already computes the weights (``attention_weights``) inside
    ``_attn`` and runs the whole forward. So override only ``_attn``: keep
    the weights on the way, then multiply them by v as step 07 does; and let
    ``forward`` call step 07's forward (``super().forward``) and add the kept
    weights to what it returns.

    Where to keep them: not in a plain attribute. MAX treats every Tensor
    attribute of a Module as a parameter (``dict(module.parameters)`` would
    list it and ``load_state_dict`` would ask for it). ``self.kept`` is a
    small plain object MAX does not look inside: write ``self.kept.weights``.
    (PyTorch users know the same idea as a forward hook.)

Coming from PyTorch? docs/pytorch-to-max.md#parameters

Check your work with ``pixi run s15`` (without pixi: ``python3.13 tasks.py s15``).
"""

from max.experimental import nn
from max.experimental.tensor import Tensor

from solutions.solution_01 import GPT2Config
from solutions.solution_07 import GPT2MultiHeadAttention


class Kept:
    """A holder MAX's module tree does not look inside (no parameters here)."""

    weights: Tensor | None = None


class GPT2AttentionWithWeights(GPT2MultiHeadAttention):
    """Step 07's attention, optionally returning its probabilities."""

    def __init__(self, config: GPT2Config, linear=nn.Linear) -> None:
        super().__init__(config, linear)
        self.kept = Kept()

    def _attn(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """Step 07's ``_attn``, keeping the weights in ``self.kept.weights``."""
        # BEGIN SOLUTION
        weights = self.attention_weights(q, k, mask)
        self.kept.weights = weights
        return weights @ v
        # END SOLUTION

    def forward(self, x: Tensor, cache=None, return_weights: bool = False):
        """Step 07's forward; with ``return_weights`` also the probabilities: (output, weights)."""
        # Call step 07's forward, then add self.kept.weights when asked.
        # BEGIN SOLUTION
        out = super().forward(x, cache)
        return (out, self.kept.weights) if return_weights else out
        # END SOLUTION
