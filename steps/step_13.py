"""Bonus step 13: multi-head attention in plain numpy.

What
    ``multi_head_attention(Q, K, V, n_heads)`` for single sequences: Q is
    (T_q, D), K and V are (T_k, D). Split D into ``n_heads`` heads of width
    d_h = D / n_heads, run scaled dot-product attention in each head, and put
    the heads side by side again: the result is (T_q, D). No mask, no
    projections: this is the formula most courses start from,

        head_i = softmax(Q_i K_i^T / sqrt(d_h)) V_i
        MultiHead(Q, K, V) = concat(head_1, ..., head_h)

Why
    It is the same arithmetic as ``_attn`` in step 07, without MAX and without
    the batch axis, so you can print every intermediate. The check compares
    your numpy with step 07's MAX ``_attn`` on the same inputs.

A worked example, and a common wrong answer
    Q = K = V = I (the 2x2 identity), n_heads = 2, so d_h = 1 and head i
    sees column i only. Head 0: q = k = v = [1, 0]^T, scores [[1, 0], [0, 0]],
    softmax of each row: [e/(e+1), 1/(e+1)] = [0.7311, 0.2689] and [0.5, 0.5];
    times v = [1, 0]^T gives [0.7311, 0.5]. Head 1 is its mirror image, so

        MultiHead(I, I, I) = [[0.7311, 0.5   ],
                              [0.5,    0.7311]]

    Some write-ups claim the identity comes back ("each token attends to
    itself"). It does not: softmax never gives weights of exactly 0 and 1.
    A score of 1 against 0 is only e:1, so every query keeps 27% of its
    attention on the other key, and a query whose scores are all equal (row
    2 of head 0: its q is 0) spreads it evenly.

Shapes of the head split, for one sequence
    (T, D) --reshape--> (T, h, d_h) --transpose--> (h, T, d_h)
    and back: (h, T, d_h) --transpose--> (T, h, d_h) --reshape--> (T, D).
    A reshape straight to (h, T, d_h) would mix positions into heads.

Check your work with ``pixi run s13`` (without pixi: ``python3.13 tasks.py s13``).
"""

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, stable for large inputs (subtract the max first)."""
    raise NotImplementedError("TODO(step 13): replace this line with your code")


def multi_head_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, n_heads: int) -> np.ndarray:
    """(T_q, D), (T_k, D), (T_k, D) -> (T_q, D): attention in ``n_heads`` heads."""
    # 1. n_heads must divide D: raise ValueError with both numbers otherwise.
    # 2. Split Q, K and V into heads: (T, D) -> (n_heads, T, d_h).
    # 3. Per head: softmax(q k^T / sqrt(d_h)) v (matmul broadcasts over heads).
    # 4. Concatenate the heads back: (n_heads, T_q, d_h) -> (T_q, D).
    raise NotImplementedError("TODO(step 13): replace this line with your code")
