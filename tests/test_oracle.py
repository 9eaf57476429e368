"""The numpy oracle (independent of MAX) agrees with the solutions, and the
checker's hard-coded facts agree with Hugging Face."""

from __future__ import annotations

import numpy as np
import pytest

from checker import maxrun, oracle
from checker.checks import step_01


def test_hf_defaults_table_is_hugging_faces():
    from transformers import GPT2Config as HFConfig

    hf = HFConfig()
    assert step_01.HF_DEFAULTS == {name: getattr(hf, name) for name in step_01.FIELDS}


def test_published_sizes_give_published_parameter_counts():
    # GPT-2's parameter count from its sizes: embeddings, blocks, final norm.
    from solutions.solution_01 import GPT2Config

    def count(c):
        E = c.n_embd
        block = 2 * 2 * E + (E * 3 * E + 3 * E) + (E * E + E) + (E * 4 * E + 4 * E) + (4 * E * E + E)
        return c.vocab_size * E + c.n_positions * E + c.n_layer * block + 2 * E

    published_millions = {"gpt2": 124, "gpt2-medium": 355, "gpt2-large": 774, "gpt2-xl": 1558}
    for name, millions in published_millions.items():
        assert round(count(GPT2Config.from_name(name)) / 1e6) == millions


@pytest.mark.parametrize("seq_len, past_len", [(1, 0), (5, 0), (1, 9), (4, 3), (70, 7)])
def test_causal_mask_matches_oracle(seq_len, past_len):
    from solutions.solution_02 import causal_mask

    got = causal_mask(seq_len, past_len).to_numpy()
    np.testing.assert_array_equal(got, oracle.causal_mask(seq_len, past_len))


def test_causal_mask_oracle_by_hand():
    m = oracle.causal_mask(2, 2)
    assert np.isneginf(m).tolist() == [[False, False, False, True], [False, False, False, False]]


def test_layer_norm_matches_oracle():
    from solutions.solution_03 import LayerNorm

    rng = np.random.default_rng(0)
    weights = maxrun.random_weights({"weight": [32], "bias": [32]}, seed=1)
    module = maxrun.build(LayerNorm, 32, weights=weights)
    for scale in (3.0, 1e-3):
        x = (1.0 + scale * rng.standard_normal((2, 5, 32))).astype(np.float32)
        got = maxrun.run(module, x)
        want = oracle.layer_norm(x, weights["weight"], weights["bias"], eps=1e-5)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_layer_norm_oracle_is_torch_style():
    # Biased variance and eps inside the sqrt, as torch.nn.LayerNorm defines it.
    x = np.array([[1.0, 2.0, 3.0, 6.0]], dtype=np.float32)
    y = oracle.layer_norm(x, np.ones(4), np.zeros(4), eps=0.0)
    np.testing.assert_allclose(y, (x - 3.0) / np.sqrt(3.5), rtol=1e-6)
