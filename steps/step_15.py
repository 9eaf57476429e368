"""Bonus step 15: attention that can also return its probabilities.

What
    ``GPT2AttentionWithWeights``: step 07's attention (same parameters, same
    output) whose forward can, when asked, also return the attention
    probabilities it used:

        forward(x, past_key, past_value, return_weights=False)
            -> (output, keys, values)                    as in step 07
            -> (output, keys, values, weights)           with return_weights=True

    ``weights`` has shape (batch, n_head, seq, past + seq): row i of head h is
    the distribution query i spreads over the keys. Every row sums to 1, and
    under the causal mask every future key gets exactly 0.

Why
    Those probabilities are what attention-map pictures show (``pixi run
    attention-map``, built on this class). Returning them is opt-in because a
    (seq x seq) tensor per head and layer costs memory nobody needs while
    generating; by default the output is exactly step 07's.

How
    Split step 07's ``_attn`` in two: ``attention_weights(q, k, mask)`` is the
    softmax, and ``_attn`` multiplies its result by v. ``forward`` is step
    07's forward, keeping the weights on the way.

Check your work with ``pixi run s15``.
"""

import math

from max.experimental import functional as F
from max.experimental.tensor import Tensor

from steps.step_01 import GPT2Config  # noqa: F401  (the checker builds the class with it)
from steps.step_02 import causal_mask
from steps.step_07 import GPT2MultiHeadAttention


class GPT2AttentionWithWeights(GPT2MultiHeadAttention):
    """Step 07's attention, optionally returning its probabilities."""

    def attention_weights(self, q: Tensor, k: Tensor, mask: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(head_dim) + mask) over the keys."""
        raise NotImplementedError("TODO(step 15): replace this line with your code")

    def _attn(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """Step 07's ``_attn``, through ``attention_weights``."""
        raise NotImplementedError("TODO(step 15): replace this line with your code")

    def forward(self, x: Tensor, past_key: Tensor | None = None, past_value: Tensor | None = None,
                return_weights: bool = False):
        """Step 07's forward; with ``return_weights`` also the probabilities."""
        # As step 07: c_attn, split Q/K/V and heads, the cache, the causal mask.
        # Then weights = self.attention_weights(q, k, mask); out = c_proj(merge(weights @ v)).
        # Return (out, k, v, weights) when return_weights, else (out, k, v).
        raise NotImplementedError("TODO(step 15): replace this line with your code")
