"""Step 12: text generation, one token at a time.

What
    ``sample_next_token(logits, temperature, rng)`` picks the next token from
    the scores of the last position, and ``generate(next_logits, prompt, ...)``
    repeats: score, pick, append, until ``max_new_tokens`` are added (or the
    end-of-text token comes).

Why
    GPT-2 only ever answers "what comes next?". Text comes from asking again
    and again, feeding each answer back in: autoregressive generation.

The math
    greedy (temperature == 0):  next = argmax(logits)
    sampling (temperature > 0): p = softmax(logits / temperature)
                                next ~ p
    A temperature below 1 sharpens p towards the greedy choice; above 1 it
    flattens p towards uniform noise. Subtract max(logits) before exp so that
    large scores do not overflow.

    ``next_logits(ids)`` is any function that runs the model on a list of
    token ids and returns the logits of the *last* position, ``[vocab_size]``;
    the last check passes one built on the solution's GPT-2 of step 11 (not
    yours: this step can be done before steps 03-11). Sampling uses
    the numpy ``rng`` it is given (``rng.choice(n, p=p)``), so a fixed seed
    reproduces the same text.

Check your work with ``pixi run s12`` (without pixi: ``python3.13 tasks.py s12``).
"""

from typing import Callable

import numpy as np


def sample_next_token(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """One token id from the logits [vocab_size] of the last position."""
    raise NotImplementedError("TODO(step 12): replace this line with your code")


def generate(
    next_logits: Callable[[list[int]], np.ndarray],
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
    eos_token: int | None = None,
) -> list[int]:
    """The prompt's continuation (new tokens only), one token at a time."""
    rng = np.random.default_rng(seed)
    # Call next_logits on the prompt plus everything generated so far; stop
    # after max_new_tokens, or right after producing eos_token (keep it).
    raise NotImplementedError("TODO(step 12): replace this line with your code")
