"""The app's in-place KV cache (model/kv_cache.py) against the course's own
(step 07's F.concat): the same logits at every step and the same greedy
tokens, on a reference checkpoint made by Hugging Face."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints import greedy, reference

from model.gpt2 import load_gpt2


@pytest.fixture(scope="module")
def both():
    folder, _, ref = reference("tiny-2l-4h")
    return (load_gpt2(folder, device="cpu", with_tokenizer=False),
            load_gpt2(folder, device="cpu", cache="concat", with_tokenizer=False), ref)


def test_in_place_and_concat_give_the_same_tokens(both):
    in_place, concat, ref = both
    assert in_place.cache == "in_place" and concat.cache == "concat"
    n = len(ref["greedy"][0])
    tokens, logits = greedy(in_place, ref["prompt"], n)
    tokens_c, logits_c = greedy(concat, ref["prompt"], n)
    np.testing.assert_array_equal(tokens, tokens_c)
    np.testing.assert_array_equal(tokens[0], ref["greedy"][0])
    assert np.abs(logits - logits_c).max() <= 1e-4


def test_a_batch_of_two_and_a_long_prefill_then_decode(both):
    in_place, concat, ref = both
    prompt = ref["ids"][:, :20]  # batch 2, 20 tokens, then 10 steps each
    np.testing.assert_array_equal(greedy(in_place, prompt, 10)[0], greedy(concat, prompt, 10)[0])


def test_a_spent_cache_is_refused(both):
    in_place, _, ref = both
    cache = in_place.empty_cache(1)
    _, after = in_place.step(ref["prompt"], cache)
    with pytest.raises(ValueError, match="already passed to step"):
        in_place.step(ref["prompt"], cache)
    assert after.length == ref["prompt"].shape[1] and not after.spent


def test_the_app_runs_the_course_s_attention_itself():
    """No attention class of the app's own: step 07's, handed the in-place
    cache object by the graph."""
    from max.dtype import DType
    from max.experimental import functional as F
    from max.experimental.tensor import default_dtype

    from model.course import course
    from model.graph import InPlaceGraph, build_lm
    from model.options import BuildOptions
    from weights import read_config

    folder, _, _ = reference("tiny-2l-4h")
    kit = course("solutions")
    with F.lazy(), default_dtype(DType.float32):
        config = read_config(folder, kit.GPT2Config)
        lm = build_lm(kit, config, BuildOptions(device="cpu"))
        graph = InPlaceGraph(lm, kit, None, config.vocab_size)
    # Named, not compared by identity (an earlier test may have imported the course afresh).
    assert {(type(b.attn).__module__, type(b.attn).__qualname__) for b in lm.transformer.h} == {
        ("solutions.solution_07", "GPT2MultiHeadAttention")}
    assert type(graph.attend.__self__).__qualname__ == "ConcatCache"


def test_the_cache_is_sized_per_generation(both):
    in_place, _, ref = both
    prompt = ref["prompt"]
    cache = in_place.empty_cache(1, prompt.shape[1] + 1)
    assert cache.capacity == prompt.shape[1] + 1 and int(cache.buffers[0].shape[2]) == cache.capacity
    logits, cache = in_place.step(prompt, cache)
    logits, cache = in_place.step(logits.argmax(-1)[:, None], cache)  # the last position that fits
    with pytest.raises(ValueError, match="do not fit a cache of"):
        in_place.step(logits.argmax(-1)[:, None], cache)
    with pytest.raises(ValueError, match="context window holds"):
        in_place.empty_cache(1, in_place.config.n_positions + 1)


def test_the_graphs_came_compiled_with_their_group(both):
    """tests/suite_graphs.py lists this file's two graphs: they were compiled
    before the file's tests, as one unit with their group's graphs, so the
    loads found them saved. Without saved graphs each test compiles its own."""
    from model import caches

    if not caches.enabled():
        pytest.skip("saved graphs are off (GPT2_MAX_SAVED_GRAPHS=0)")
    assert both[0].saved_graph and both[1].saved_graph
