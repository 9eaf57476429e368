"""Step 02: the causal mask.

What
    ``causal_mask(seq_len, past_len)`` returns an additive mask of shape
    ``[seq_len, past_len + seq_len]``: 0 where a query may look, -inf where it
    may not. Attention adds it to the scores before the softmax, and
    ``exp(-inf) = 0`` removes the hidden positions.

Why
    GPT-2 predicts each token from the tokens before it. While training (and
    when reading a prompt) all positions are computed at once, so position i
    must be stopped from seeing positions after i: otherwise it could copy the
    answer.

    Later, a KV cache keeps the keys and values of the ``past_len`` tokens
    already processed, and only the ``seq_len`` new tokens are queries. Query
    row i is then the token at absolute position ``past_len + i``; it sees all
    cached positions and the new ones up to itself.

The math
    key j is visible to query i  <=>  j <= past_len + i

    past_len = 0, seq_len = 3        past_len = 2, seq_len = 2
        [ 0  -inf -inf ]                 [ 0  0  0  -inf ]
        [ 0   0   -inf ]                 [ 0  0  0   0   ]
        [ 0   0    0   ]

    The diagonal (a token looking at itself) is visible.

Useful MAX calls
    ``Tensor.arange(start, stop, dtype=..., device=...)`` counts positions,
    ``t.reshape([n, 1])`` makes a column, comparisons such as ``F.greater(a, b)``
    broadcast like numpy, and ``F.where(condition, a, b)`` picks elementwise
    (make ``a`` or ``b`` a float32 tensor: given two plain Python numbers it
    picks an integer dtype, and -inf has no integer).
    Arange-and-compare works even when the lengths are symbolic dimensions
    inside a compiled graph, which is what the KV cache will need.

Coming from PyTorch? docs/pytorch-to-max.md#masking-with--inf, docs/pytorch-to-max.md#new-tensors-dtype-and-device

Check your work with ``pixi run s02`` (without pixi: ``python3.13 tasks.py s02``).
"""

from max.driver import CPU, Device
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import Tensor
from max.graph import DimLike


def causal_mask(
    seq_len: DimLike,
    past_len: DimLike = 0,
    *,
    dtype: DType = DType.float32,
    device: Device | None = None,
) -> Tensor:
    """Additive causal mask of shape ``[seq_len, past_len + seq_len]``.

    Entry ``[i, j]`` is 0 when key ``j`` is visible to query ``i`` (that is,
    ``j <= past_len + i``) and ``-inf`` otherwise.
    """
    device = device or CPU()
    # 1. The absolute position of each query row: past_len, ..., past_len + seq_len - 1,
    #    as a column of shape [seq_len, 1].
    # 2. The position of each key: 0, ..., past_len + seq_len - 1, as a row [1, total].
    # 3. Where key > query the entry is -inf, elsewhere 0.
    raise NotImplementedError("TODO(step 02): replace this line with your code")
