"""Step 01: the GPT-2 configuration.

What
    A frozen dataclass, ``GPT2Config``, that holds every size the model needs:
    vocabulary, context length, width, depth, number of heads, and the layer
    norm epsilon. Every later step reads its sizes from here.

Why
    GPT-2 comes in four sizes that share one architecture and differ only in
    these numbers. Hugging Face stores them in ``config.json`` under exactly
    these names (``n_embd``, ``n_head``, ...), so a checkpoint's config maps
    onto this class field by field.

    | name        | n_layer | n_head | n_embd | parameters |
    |-------------|---------|--------|--------|------------|
    | gpt2        | 12      | 12     | 768    | 124M       |
    | gpt2-medium | 24      | 16     | 1024   | 350M       |
    | gpt2-large  | 36      | 20     | 1280   | 774M       |
    | gpt2-xl     | 48      | 25     | 1600   | 1558M      |

    All four use vocab_size 50257, n_positions 1024, layer_norm_epsilon 1e-5.

The math
    Attention splits the width ``n_embd`` into ``n_head`` heads of
    ``head_dim = n_embd // n_head`` features each, so ``n_embd`` must be
    divisible by ``n_head``. A config that breaks this (or has a size <= 0)
    must be refused when it is built, not three steps later as a shape error.

Check your work with ``pixi run s01`` (without pixi: ``python3.13 tasks.py s01``).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class GPT2Config:
    """Sizes of a GPT-2 model. The defaults are the 124M model ("gpt2")."""

    # The fields, with the defaults of the smallest GPT-2 (see the table above).
    vocab_size: int = ...  # TODO: tokens in GPT-2's BPE vocabulary
    n_positions: int = ...  # TODO: longest context (learned positions)
    n_embd: int = ...  # TODO: width of the residual stream
    n_layer: int = ...  # TODO: number of transformer blocks
    n_head: int = ...  # TODO: attention heads per block
    layer_norm_epsilon: float = ...  # TODO: added to the variance in layer norm

    def __post_init__(self) -> None:
        # Refuse impossible sizes early, with a message that says what is wrong.
        # Raise ValueError when any of vocab_size, n_positions, n_embd, n_layer,
        # n_head is not a positive integer, when layer_norm_epsilon <= 0, and
        # when n_embd is not divisible by n_head (test the sizes first: with
        # n_head = 0, n_embd % n_head divides by zero).
        raise NotImplementedError("TODO(step 01): replace this line with your code")

    @property
    def head_dim(self) -> int:
        """Features per attention head."""
        raise NotImplementedError("TODO(step 01): replace this line with your code")

    @classmethod
    def from_name(cls, name: str) -> "GPT2Config":
        """The config of a published GPT-2 size, e.g. ``from_name("gpt2-xl")``."""
        if name not in GPT2_SIZES:
            raise ValueError(f"unknown GPT-2 size {name!r}; known: {', '.join(GPT2_SIZES)}")
        return cls(**GPT2_SIZES[name])


# n_layer, n_head and n_embd of each published size (the table above).
GPT2_SIZES: dict[str, dict[str, int]] = {
    # TODO: one entry per size, e.g. "gpt2": dict(n_layer=..., n_head=..., n_embd=...)
}
