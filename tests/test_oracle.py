"""The numpy oracle (independent of MAX) agrees with the solutions, and the
checker's hard-coded facts agree with Hugging Face."""

from __future__ import annotations

import numpy as np
import pytest

from checker import maxrun, oracle
from checker.checks import step_01
from checker.checks.step_10 import caches_of


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


SMALL = dict(vocab_size=101, n_positions=96, n_embd=48, n_layer=3, n_head=4)


def _small_lm(seed: int = 0):
    from solutions.solution_01 import GPT2Config
    from solutions.solution_11 import GPT2LMHeadModel

    model = maxrun.build(GPT2LMHeadModel, GPT2Config(**SMALL))
    weights = maxrun.random_weights(maxrun.parameter_shapes(model), seed=seed)
    model.load_state_dict(weights)
    return model, weights


def test_full_gpt2_forward_matches_oracle():
    model, weights = _small_lm()
    ids = np.random.default_rng(1).integers(0, SMALL["vocab_size"], size=(2, 33)).astype(np.int64)
    logits, present = maxrun.run_cached(model, ids, caches_of(n_layer=SMALL["n_layer"]))
    want, want_present = oracle.lm_logits(ids, weights, SMALL["n_head"])
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)
    assert len(present) == SMALL["n_layer"]
    for (k, v), (wk, wv) in zip(present, want_present):
        np.testing.assert_allclose(k, wk, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(v, wv, rtol=1e-4, atol=1e-4)


def test_cached_forward_matches_oracle():
    model, weights = _small_lm(seed=2)
    ids = np.random.default_rng(3).integers(0, SMALL["vocab_size"], size=(1, 20)).astype(np.int64)
    _, past = oracle.lm_logits(ids[:, :17], weights, SMALL["n_head"])
    logits, present = maxrun.run_cached(model, ids[:, 17:], caches_of(past))
    want, want_present = oracle.lm_logits(ids, weights, SMALL["n_head"])
    np.testing.assert_allclose(logits, want[:, 17:], rtol=1e-4, atol=1e-4)
    for (k, v), (wk, wv) in zip(present, want_present):  # the caches now hold all 20 positions
        np.testing.assert_allclose(k, wk, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(v, wv, rtol=1e-4, atol=1e-4)


def test_generation_matches_oracle_greedy_and_seeded_sampling_repeats():
    from solutions.solution_12 import generate

    model, weights = _small_lm(seed=4)

    def next_logits(ids):
        logits = maxrun.lazily(model, maxrun.tensor(np.array([ids])), None, maxrun.tensor(np.array([len(ids) - 1])))
        return logits[0, -1]

    prompt = [7, 3, 99]
    assert generate(next_logits, prompt, 6) == oracle.greedy(prompt, weights, SMALL["n_head"], 6)
    sampled = generate(next_logits, prompt, 6, temperature=0.9, seed=11)
    assert sampled == generate(next_logits, prompt, 6, temperature=0.9, seed=11)
