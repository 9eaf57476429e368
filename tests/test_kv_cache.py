"""The app's in-place KV cache (model/kv_cache.py) and its capture-safe twin,
the static cache, against the course's own (step 07's F.concat): the same
logits at every step and the same greedy tokens, on a reference checkpoint
made by Hugging Face; and the static cache's decode steps driven as a GPU
replays them (a stand-in for MAX's capture and replay, which run on a GPU
only: tests/test_gpu.py runs the real ones)."""

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


@pytest.fixture(scope="module")
def static():
    folder, _, _ = reference("tiny-2l-4h")
    return load_gpt2(folder, device="cpu", cache="static", with_tokenizer=False)


def assert_same_greedy(gpt2, other, ref) -> None:
    """``gpt2`` and ``other`` give the reference's greedy tokens on its prompt, and logits within 1e-4."""
    n = len(ref["greedy"][0])
    tokens, logits = greedy(gpt2, ref["prompt"], n)
    tokens_o, logits_o = greedy(other, ref["prompt"], n)
    np.testing.assert_array_equal(tokens, tokens_o)
    np.testing.assert_array_equal(tokens[0], ref["greedy"][0])
    assert np.abs(logits - logits_o).max() <= 1e-4


def test_in_place_and_concat_give_the_same_tokens(both):
    in_place, concat, ref = both
    assert in_place.cache == "in_place" and concat.cache == "concat"
    assert_same_greedy(in_place, concat, ref)


def test_a_batch_of_two_and_a_long_prefill_then_decode(both):
    in_place, concat, ref = both
    prompt = ref["ids"][:, :20]  # batch 2, 20 tokens, then 10 steps each
    np.testing.assert_array_equal(greedy(in_place, prompt, 10)[0], greedy(concat, prompt, 10)[0])


def test_the_static_cache_gives_the_in_place_cache_s_logits_and_tokens(both, static):
    """The length a device value, the rows written and read over the whole
    capacity, the mask over it: the same greedy tokens as the in-place cache
    and the reference, batch 1 and 2, a long prefill then decoding."""
    in_place, _, ref = both
    assert static.cache == "static" and not static.options.replays  # the CPU runs it without capture
    assert_same_greedy(static, in_place, ref)
    prompt = ref["ids"][:, :20]
    np.testing.assert_array_equal(greedy(static, prompt, 10)[0], greedy(in_place, prompt, 10)[0])


class Replaying:
    """MAX's capture and replay as a CPU can stand in for them: a capture
    keeps its input buffers and makes the call; a replay makes it again over
    the very buffers captured (as a device graph reads them, whatever was
    copied into them since) and writes its logits into the capture's."""

    def __init__(self, model) -> None:
        self.model, self.graphs, self.calls = model, {}, []

    def execute(self, *inputs):
        self.calls.append("execute")
        return self.model.execute(*inputs)

    def capture(self, key, *inputs):
        self.calls.append(("capture", key))
        self.graphs[key] = (inputs, self.model.execute(*inputs))
        return self.graphs[key][1]

    def replay(self, key, *inputs):
        captured, outputs = self.graphs[key]
        assert all(a is b for a, b in zip(inputs, captured, strict=True)), "a replay must get the captured buffers"
        self.calls.append(("replay", key))
        # Read once the call is done (a CPU call may return before its work): to_numpy waits for it.
        np.copyto(outputs[0].to_numpy(), self.model.execute(*captured)[0].to_numpy())


def test_decode_steps_replayed_over_kept_buffers_give_the_same_tokens(both, static, monkeypatch):
    """With replay on, the first decode step of a batch size and capacity is
    captured and every later one replayed over the same buffers, its ids and
    cached length copied in; a prompt is a plain call. Two generations of the
    same shape share one capture (the second's rows past its length hold the
    first's, masked) and give the in-place cache's tokens; the first one's
    cache, its buffers handed on, is refused."""
    from types import SimpleNamespace

    from model.options import BuildOptions
    from model.runtime import graph_key

    in_place, _, ref = both
    monkeypatch.setattr(BuildOptions, "replays", property(lambda self: True))
    engine = Replaying(static.compiled.engine_model)
    monkeypatch.setattr(static, "compiled", SimpleNamespace(engine_model=engine))
    monkeypatch.setattr(static, "captured", {})
    n = len(ref["greedy"][0])
    tokens, _ = greedy(static, ref["prompt"], n)
    np.testing.assert_array_equal(tokens[0], ref["greedy"][0])
    key = graph_key(1, 64)  # the context window rounded up to the capacity step, at most the window
    assert engine.calls == ["execute", ("capture", key), *[("replay", key)] * n]
    first = static.empty_cache(1)
    prompt = ref["ids"][:1, 5:12]
    np.testing.assert_array_equal(greedy(static, prompt, 6)[0], greedy(in_place, prompt, 6)[0])
    assert engine.calls.count(("capture", key)) == 1 and len(static.captured) == 1
    with pytest.raises(ValueError, match="handed to a newer cache"):
        static.step(prompt, first)


def test_the_bench_measures_over_a_static_cache(static, monkeypatch):
    """bench's figures over the static cache (a GPU's): each timed prefill
    hands the kept buffers of its shape to a new cache, never holding two."""
    from bench.__main__ import measure_ours

    monkeypatch.setattr("model.gpt2.load_gpt2", lambda *args, **kwargs: static)
    out = measure_ours(static.source, "float32", "cpu", 2, 4, prefill=(4, 8), batches=(1, 2))
    assert out["cache"] == "static" and not out["replay"]
    assert set(out["prefill_ms"]) == {"4", "8"} and set(out["decode_tok_s"]) == {"1", "2"}


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
    from model.graph import InPlaceGraph, StaticGraph, build_lm
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
    # The static graph: the course's blocks as they are, step 06's embedding among them.
    with F.lazy(), default_dtype(DType.float32):
        lm = build_lm(kit, config, BuildOptions(device="cpu", cache="static"))
        StaticGraph(lm, kit, None, config.vocab_size)
    assert type(lm.transformer.wpe).__qualname__ == "PositionEmbedding"
    assert {type(b.attn).__qualname__ for b in lm.transformer.h} == {"GPT2MultiHeadAttention"}


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


def test_the_graphs_came_compiled_with_their_group(both, static):
    """tests/suite_graphs.py lists this file's three graphs: they were compiled
    before the file's tests, as one unit with their group's graphs, so the
    loads found them saved. Without saved graphs each test compiles its own."""
    from model import caches

    if not caches.enabled():
        pytest.skip("saved graphs are off (GPT2_MAX_SAVED_GRAPHS=0)")
    assert both[0].saved_graph and both[1].saved_graph and static.saved_graph


def test_the_cache_a_build_takes(monkeypatch):
    """auto: the static cache on a GPU while replay is on (its decode steps
    replayed), the in-place one elsewhere, with --no-replay or for an
    attention map; the graph's name holds the cache taken, so the CPU's
    default graph is named as before."""
    from model import options as options_module
    from model.device import Placement
    from model.options import REPLAY_ENV, BuildOptions

    assert BuildOptions(device="cpu").kv_cache == "in_place" and not BuildOptions(device="cpu").replays
    assert BuildOptions(device="cpu").graph_facts() == {"linear": "custom", "cache": "in_place",
                                                        "attention_layer": None, "kernels": True}
    monkeypatch.setattr(options_module, "choose", lambda device, dtype: Placement("gpu", "float32"))
    gpu = BuildOptions(device="gpu")
    assert gpu.kv_cache == "static" and gpu.replays and gpu.graph_facts()["cache"] == "static"
    assert BuildOptions(device="gpu", replay=False).kv_cache == "in_place"
    assert BuildOptions(device="gpu", attention_layer=0).kv_cache == "in_place"
    assert BuildOptions(device="gpu", cache="static", replay=False).kv_cache == "static"
    assert not BuildOptions(device="gpu", cache="static", replay=False).replays
    monkeypatch.setenv(REPLAY_ENV, "0")
    assert not BuildOptions(device="gpu").replay and BuildOptions(device="gpu").kv_cache == "in_place"


def test_no_replay_on_the_command_line():
    from model.cli import parser

    assert parser().parse_args(["x"]).replay and not parser().parse_args(["--no-replay", "x"]).replay
