"""The generation engine on a toy model (fast, no MAX): stopping, streaming,
context limit, interruption, batching and sampling."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from model.generate import ContextError, generate
from model.sampling import Sampling, next_token

GREEDY = Sampling(temperature=0.0, top_k=None)


class ToyTokenizer:
    """One character per token: ids 0-25 are a-z, 26 is ' ', 27 is the end."""

    eos_token_id = 27

    def __len__(self):
        return 28

    def encode(self, text):
        return [26 if c == " " else ord(c) - 97 for c in text]

    def decode(self, ids):
        return "".join(" " if i == 26 else chr(97 + i) for i in ids if i != 27)


@dataclass
class ToyConfig:
    n_positions: int = 40


class ToyModel:
    """Next token = (last token + 1) % 27, or the end token after 'z' when eos_after_z."""

    def __init__(self, n_positions=40, eos_after_z=False, eos_token_ids=(27,)):
        self.config, self.tokenizer, self.eos_after_z = ToyConfig(n_positions), ToyTokenizer(), eos_after_z
        self.eos_token_ids = eos_token_ids
        self.calls = []

    def empty_cache(self, batch, length=None):
        self.capacity = length
        return [0] * batch

    def step(self, ids, cache):
        ids = np.asarray(ids)
        self.calls.append(ids.shape)
        cache = [c + ids.shape[1] for c in cache]
        assert max(cache) <= self.config.n_positions, "fed past the context window"
        logits = np.zeros((len(ids), 28))
        for b, last in enumerate(ids[:, -1]):
            nxt = 27 if (self.eos_after_z and last == 25) else (last + 1) % 27
            logits[b, nxt] = 10.0
        return logits, cache


def test_greedy_prefills_once_then_one_token_per_step():
    model = ToyModel()
    [r] = generate(model, ["abc"], 5, GREEDY)
    assert r.text == "defgh" and r.stop_reason == "length"
    assert model.calls == [(1, 3)] + [(1, 1)] * 4
    assert model.capacity == 3 + 4  # the cache is sized for what is fed: the prompt and 4 tokens


def test_eos_stops_and_is_not_shown():
    [r] = generate(ToyModel(eos_after_z=True), ["wx"], 10, GREEDY)
    assert r.text == "yz" and r.stop_reason == "eos"
    assert r.tokens[-1] == 27  # kept in the tokens, as step 12 and HF's generate keep it


def test_the_checkpoints_eos_ids_end_generation():
    # A checkpoint whose generation_config.json names other end ids than the
    # tokenizer's: those end the text ('d' is id 3).
    [r] = generate(ToyModel(eos_token_ids=(3, 27)), ["a"], 10, GREEDY)
    assert r.text == "bc" and r.stop_reason == "eos"


def test_stop_string_cuts_the_text():
    [r] = generate(ToyModel(), ["a"], 10, Sampling(temperature=0.0, top_k=None, stop=("ef",)))
    assert r.text == "bcd" and r.stop_reason == "stop"
    assert r.tokens == [1, 2, 3]  # the tokens of the returned text, not of the stop string


def test_context_window_stops_with_a_reason():
    model = ToyModel(n_positions=10)
    [r] = generate(model, ["abcdefgh"], 50, GREEDY)
    assert len(r.tokens) == 10 - 8 + 1 and r.stop_reason == "context"
    with pytest.raises(ContextError):
        generate(model, ["a" * 11], 5, GREEDY)


def test_batches_by_length_and_each_equals_alone():
    prompts = ["abc", "xy", "hello", "mno", "q"]
    together = generate(ToyModel(), prompts, 6, GREEDY)
    alone = [generate(ToyModel(), [p], 6, GREEDY)[0] for p in prompts]
    assert [r.text for r in together] == [r.text for r in alone]
    model = ToyModel()
    generate(model, prompts, 2, GREEDY)
    assert sorted(model.calls[:1] + model.calls[2:3] + model.calls[4:5] + model.calls[6:7]) == sorted(
        [(2, 3), (1, 2), (1, 5), (1, 1)])


def test_streaming_reassembles_the_text():
    pieces = []
    [r] = generate(ToyModel(), ["abc"], 7, GREEDY, on_text=lambda i, t: pieces.append((i, t)))
    assert "".join(t for _, t in pieces) == r.text and all(i == 0 for i, _ in pieces)


def test_interrupt_keeps_what_was_generated():
    seen = []

    def on_text(i, text):
        seen.append(text)
        if len(seen) == 3:
            raise KeyboardInterrupt

    [r] = generate(ToyModel(), ["abc"], 10, GREEDY, on_text=on_text)
    assert r.stop_reason == "interrupted" and r.text == "def"


def test_seeded_sampling_reproduces():
    sampling = Sampling(temperature=1.5, top_k=None)
    first = generate(ToyModel(), ["abc"], 10, sampling, seed=3)[0].tokens
    assert first == generate(ToyModel(), ["abc"], 10, sampling, seed=3)[0].tokens


LOGITS = np.array([3.0, 2.5, 2.0, 0.0, -1.0])


def _freq(sampling, history=None, n=4000):
    rng = np.random.default_rng(0)
    return np.bincount([next_token(LOGITS, sampling, rng, history) for _ in range(n)], minlength=5) / n


def test_top_k_top_p_and_penalty():
    assert set(np.nonzero(_freq(Sampling(1.0, top_k=2)))[0]) == {0, 1}
    p = np.exp(LOGITS) / np.exp(LOGITS).sum()  # [0.49, 0.30, 0.18, ...]
    assert set(np.nonzero(_freq(Sampling(1.0, top_k=None, top_p=0.7)))[0]) == {0, 1}
    assert set(np.nonzero(_freq(Sampling(1.0, top_k=None, top_p=0.4)))[0]) == {0}
    free = _freq(Sampling(1.0, top_k=None))
    assert np.abs(free - p).max() < 0.03
    assert next_token(LOGITS, Sampling(0.0, repetition_penalty=2.0), None, [0]) == 1  # 3/2 < 2.5
    assert next_token(LOGITS, Sampling(0.0), None, [0]) == 0


def test_greedy_reads_the_float32_logits_as_the_float64_path_did():
    # next_token's greedy shortcut skips the float64 copy: the same token, ties included.
    logits = np.random.default_rng(0).standard_normal(50257).astype(np.float32)
    logits[[7, 9000]] = logits.max() + 1  # a tie: the first one wins, as before
    assert next_token(logits, Sampling(0.0), None) == 7 == int(np.argmax(logits.astype(np.float64)))
    assert next_token(logits, Sampling(0.0), None, [7]) == 7  # no penalty: history changes nothing
    assert next_token(logits, Sampling(0.0, repetition_penalty=2.0), None, [7]) == 9000  # the penalty still applies


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.1), "--temperature"), (dict(top_k=0), "--top-k"), (dict(top_p=0.0), "--top-p"),
    (dict(top_p=1.5), "--top-p"), (dict(stop=("",)), "--stop"), (dict(repetition_penalty=0), "--repetition-penalty"),
])
def test_bad_sampling_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**kwargs).validate()


class NoisyToyModel(ToyModel):
    """ToyModel with logits that leave room for sampling (several likely tokens)."""

    def step(self, ids, cache):
        logits, cache = super().step(ids, cache)
        return np.where(logits > 0, 2.0, np.linspace(0, 1.5, logits.shape[-1])), cache


def test_a_seeded_prompt_samples_the_same_alone_and_in_any_batch():
    sampling = Sampling(temperature=1.0, top_k=None)
    prompts = ["abc", "hello there", "xy"]  # three lengths: three groups
    alone = {p: generate(NoisyToyModel(), [p], 12, sampling, seed=7)[0].tokens for p in prompts}
    batch = generate(NoisyToyModel(), prompts, 12, sampling, seed=7)
    reordered = generate(NoisyToyModel(), prompts[::-1] + ["zz"], 12, sampling, seed=7)
    assert {r.prompt: r.tokens for r in batch} == alone
    assert {r.prompt: r.tokens for r in reordered if r.prompt in alone} == alone
    assert generate(NoisyToyModel(), ["abc"], 12, sampling, seed=8)[0].tokens != alone["abc"]


def test_two_copies_of_a_prompt_get_two_samples():
    sampling = Sampling(temperature=1.0, top_k=None)
    first, second = generate(NoisyToyModel(), ["abc", "abc"], 12, sampling, seed=7)
    assert first.tokens != second.tokens
    assert first.tokens == generate(NoisyToyModel(), ["abc"], 12, sampling, seed=7)[0].tokens


class PaddedToyModel(ToyModel):
    """Four padded vocabulary rows past the tokenizer's 28 tokens, scoring highest."""

    def step(self, ids, cache):
        logits, cache = super().step(ids, cache)
        return np.concatenate([logits, np.full((len(logits), 4), 50.0)], axis=1), cache


def test_padded_vocabulary_rows_are_never_sampled():
    assert generate(PaddedToyModel(), ["abc"], 5, GREEDY)[0].text == "defgh"
    sampled = generate(PaddedToyModel(), ["abc"], 30, Sampling(temperature=2.0, top_k=None), seed=1)[0]
    assert sampled.tokens and max(sampled.tokens) < 28


def _full_sort_top_p(logits, sampling, rng):
    """The earlier top-p: an argsort of the whole vocabulary (the reference)."""
    scores = np.asarray(logits, dtype=np.float64) / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < len(scores):
        scores[scores < np.partition(scores, -sampling.top_k)[-sampling.top_k]] = -np.inf
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    mask = np.zeros_like(probs, dtype=bool)
    mask[order[cumulative - probs[order] < sampling.top_p]] = True
    probs = np.where(mask, probs, 0.0)
    return int(rng.choice(len(probs), p=probs / probs.sum()))


@pytest.mark.parametrize("top_k", [None, 1, 40, 200])
@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9])
def test_top_p_sorts_only_the_candidates_with_the_same_result(top_k, top_p):
    sampling = Sampling(temperature=0.9, top_k=top_k, top_p=top_p)
    logits = np.random.default_rng(top_k or 0).standard_normal(5000).astype(np.float32)
    logits[10:20] = logits[10]  # ties
    for seed in range(20):
        assert next_token(logits, sampling, np.random.default_rng(seed)) == \
            _full_sort_top_p(logits, sampling, np.random.default_rng(seed))


def test_a_padded_vocabulary_and_bool_buffers_give_hugging_faces_greedy_tokens(tmp_path):
    """nanoGPT's export shape (50304 rows, GPT-2's 50257 tokens; made by
    make_reference.py, float16 on disk), as is and with the bool causal-mask
    buffers older transformers saved: HF's greedy tokens, token for token."""
    import shutil

    from checkpoints import reference
    from safetensors.numpy import save_file

    from model.gpt2 import load_gpt2
    from weights.checkpoint import read_safetensors

    folder, sizes, ref = reference("padded-vocab")
    with_buffers = tmp_path / "with-buffers"
    shutil.copytree(folder, with_buffers)
    n = sizes["n_positions"]
    state = {k: np.ascontiguousarray(v) for k, v in read_safetensors(folder / "model.safetensors").items()}
    for i in range(sizes["n_layer"]):
        state[f"transformer.h.{i}.attn.bias"] = np.tril(np.ones((n, n), bool))[None, None]
    save_file(state, str(with_buffers / "model.safetensors"), metadata={"format": "pt"})
    want = ref["greedy"][0].tolist()
    for path in (folder, with_buffers):
        gpt2 = load_gpt2(path, device="cpu")
        assert gpt2.config.vocab_size == 50304 and len(gpt2.tokenizer) == 50257
        assert np.abs(gpt2.forward_logits(ref["ids"]) - ref["logits"]).max() <= 1e-4
        [result] = generate(gpt2, [gpt2.tokenizer.decode(ref["prompt"][0])], len(want), Sampling(temperature=0.0))
        assert result.tokens == want, path.name
