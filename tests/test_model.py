"""The compiled model against Hugging Face's reference outputs (tests/reference,
made by tests/reference/make_reference.py with transformers + torch)."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints import reference

from model.gpt2 import load_gpt2

CONFIGS = ["tiny-2l-4h", "tiny-3l-3h"]


@pytest.fixture(scope="module", params=CONFIGS)
def compiled(request):
    folder, sizes, arrays = reference(request.param)
    # The app's own graph: forward_logits asks it for every position.
    gpt2 = load_gpt2(folder, device="cpu", with_tokenizer=False)
    return gpt2, arrays


def test_logits_match_hugging_face(compiled):
    gpt2, ref = compiled
    logits = gpt2.forward_logits(ref["ids"])
    assert logits.shape == ref["logits"].shape and logits.dtype == np.float32
    assert np.abs(logits - ref["logits"]).max() <= 1e-4
    np.testing.assert_array_equal(logits.argmax(-1), ref["logits"].argmax(-1))


def test_each_prefix_batch_row_matches(compiled):
    # Batch 1 and a prefix of the sequence: the symbolic dims really are symbolic.
    gpt2, ref = compiled
    logits = gpt2.forward_logits(ref["ids"][1:, :7])
    assert np.abs(logits - ref["logits"][1:, :7]).max() <= 1e-4


def test_cached_greedy_equals_hugging_face_generate(compiled):
    gpt2, ref = compiled
    prompt, expected = ref["prompt"], ref["greedy"][0]
    logits, cache = gpt2.step(prompt, gpt2.empty_cache(1))
    tokens = []
    for _ in range(len(expected)):
        token = int(logits[0].argmax())
        tokens.append(token)
        logits, cache = gpt2.step(np.array([[token]]), cache)
    assert tokens == expected.tolist()


def test_compile_time_is_reported(compiled):
    gpt2, _ = compiled
    assert gpt2.compile_seconds > 0 and gpt2.placement.kind == "cpu" and gpt2.placement.dtype == "float32"


def test_step_12_generate_over_the_compiled_model(compiled):
    # The learner's loop (step 12) driving the compiled graph, without a cache:
    # the same tokens as Hugging Face's cached generate.
    from solutions.solution_12 import generate

    gpt2, ref = compiled

    def next_logits(ids):
        return gpt2.forward_logits(np.array([ids]))[0, -1]

    tokens = generate(next_logits, ref["prompt"][0].tolist(), len(ref["greedy"][0]))
    assert tokens == ref["greedy"][0].tolist()


def test_a_head_widened_with_zero_rows_gives_the_same_logits(tmp_path, monkeypatch):
    """The graph's LM head may be wider than the vocabulary (on a GPU: 50257
    rounded up to a multiple of 64, zero rows, cut off in the graph): the
    logits the caller sees, their shape and the greedy tokens are the
    unwidened graph's. Here forced on the CPU, on the shared tiny shape (its
    plain graph is the app tests' own: only the widened one compiles)."""
    from checkpoints import TINY, greedy, write_checkpoint

    import model.gpt2

    folder = write_checkpoint(tmp_path / "m", TINY)
    vocab = TINY["vocab_size"]
    ids = np.random.default_rng(0).integers(0, vocab, (2, 9))
    plain = load_gpt2(folder, device="cpu", with_tokenizer=False)
    monkeypatch.setitem(model.gpt2.VOCAB_MULTIPLE, "cpu", 64)
    widened = load_gpt2(folder, device="cpu", with_tokenizer=False)
    assert (plain.config.vocab_size, widened.config.vocab_size) == (vocab, vocab)
    assert model.gpt2.graph_vocab(vocab, widened.placement) == 50304  # the graph's head: 47 zero rows more
    expected, got = plain.forward_logits(ids), widened.forward_logits(ids)
    assert got.shape == expected.shape == (2, 9, vocab)
    assert np.abs(got - expected).max() <= 1e-5
    np.testing.assert_array_equal(greedy(widened, ids, 4)[0], greedy(plain, ids, 4)[0])
