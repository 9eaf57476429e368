"""Step 08: residual connections and pre-layer-norm.

What
    ``pre_norm_residual(x, norm, sublayer)``: normalise, apply the sub-layer,
    and add the result back onto the input:

        x + sublayer(norm(x))

Why
    The residual path (``x + ...``) is a highway: every block only adds a
    correction to the stream instead of replacing it, so gradients and
    information flow through dozens of blocks unharmed.

    Where the norm sits matters. The 2017 Transformer ("post-LN") normalised
    *after* adding: ``norm(x + sublayer(x))``. Every block then rescales the
    whole stream, and deep post-LN stacks need careful learning-rate warm-up to
    train at all. GPT-2 ("pre-LN") normalises only the sub-layer's *input*;
    the stream itself is never normalised inside the stack, so it keeps its
    scale from block to block. That is also why GPT-2 needs one last layer
    norm, ``ln_f``, after the final block (step 10).

The math
    pre-LN  (GPT-2):  y = x + sublayer(norm(x))
    post-LN (2017):   y = norm(x + sublayer(x))

Check your work with ``pixi run s08`` (without pixi: ``python3.13 tasks.py s08``).
"""

from typing import Callable

from max.experimental.tensor import Tensor


def pre_norm_residual(x: Tensor, norm: Callable[[Tensor], Tensor],
                      sublayer: Callable[[Tensor], Tensor]) -> Tensor:
    """GPT-2's wiring around a sub-layer: ``x + sublayer(norm(x))``."""
    raise NotImplementedError("TODO(step 08): replace this line with your code")
