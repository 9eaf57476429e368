"""Quantized weights (Q4_0 and Q6_K, model/quantize.py): the block formats,
MAX's kernels on them (in test_fast_linear.py's graph of layers), and the quantized model against Hugging Face on a
trained checkpoint (tests/reference/make_trained.py)."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints import greedy, reference

from model.quantize import BLOCK, BLOCK_BYTES, ENCODINGS, SUPER, dequantize_q4_0, quantize_q4_0, quantize_q6_k


def representable(rng, rows: int, cols: int, d: float = -0.25) -> np.ndarray:
    """Weights that Q4_0 stores exactly: (code - 8) * d, code 0 in every block."""
    codes = rng.integers(1, 16, (rows, cols // BLOCK, BLOCK))
    codes[..., 3] = 0  # the largest magnitude, 8 * |d|, fixes the scale
    return ((codes - 8) * d).reshape(rows, cols).astype(np.float32)


def test_layout_of_one_block():
    # ggml's block_q4_0: float16 scale, then weight i in byte i's low nibble
    # and weight i + 16 in its high nibble.
    weights = representable(np.random.default_rng(0), 1, BLOCK)
    blocks = quantize_q4_0(weights)
    assert blocks.shape == (1, BLOCK_BYTES) and blocks.dtype == np.uint8
    assert blocks[0, :2].view(np.float16)[0] == np.float16(-0.25)
    codes = np.rint(weights[0] / -0.25 + 8).astype(np.uint8)
    np.testing.assert_array_equal(blocks[0, 2:], codes[:16] | (codes[16:] << 4))


def test_representable_weights_round_trip_exactly():
    weights = representable(np.random.default_rng(1), 6, 4 * BLOCK)
    np.testing.assert_array_equal(dequantize_q4_0(quantize_q4_0(weights)), weights)


def test_error_is_at_most_half_a_step():
    weights = np.random.default_rng(2).standard_normal((8, 3 * BLOCK)).astype(np.float32)
    back = dequantize_q4_0(quantize_q4_0(weights))
    step = np.abs(weights.reshape(8, 3, BLOCK)).max(-1, keepdims=True) / 8
    err = np.abs(back - weights).reshape(8, 3, BLOCK)
    # Codes run -8..7 times |d|: the far side of the extreme is cut at 7 steps.
    assert (err <= step / 2 * 1.001 + (np.abs(weights.reshape(8, 3, BLOCK)) > 7.5 * step) * step).all()


def test_every_quantized_dtype_has_an_encoding():
    from model.device import QUANTIZED_DTYPES

    # q8_0 runs on this project's kernel (model/kernels, tests/test_fast_linear.py);
    # the others are GGUF blocks; q4_0m is q4_0 with the head in q6_k.
    assert set(QUANTIZED_DTYPES) == set(ENCODINGS) | {"q8_0", "q4_0m"}


def test_q4_0m_is_llama_cpp_s_mixture():
    # llama-quantize's default Q4_0 keeps GPT-2's tied head in Q6_K (Q8_0 where
    # the width does not fit Q6_K's 256). The head is the Linear without a bias (step 11).
    from max.experimental import functional as F

    from model.layers import quantized_linear
    from model.layers.q4_0 import Q4_0Linear
    from model.layers.q8_0 import Q8_0Linear
    from model.layers.qmatmul import QMatmulLinear

    make = quantized_linear("q4_0m")
    with F.lazy():
        block, head, narrow_head = make(256, 40), make(256, 40, bias=False), make(128, 40, bias=False)
    assert type(block) is Q4_0Linear
    assert type(head) is QMatmulLinear and head.encoding == "q6_k"
    assert type(narrow_head) is Q8_0Linear


def test_zero_blocks_and_bad_widths():
    assert not dequantize_q4_0(quantize_q4_0(np.zeros((2, BLOCK), np.float32))).any()
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q4_0(np.ones((2, 48), np.float32))


def test_q6_k_round_trip_and_layout():
    # Q6_K stores d * scale * (q - 32): build weights it represents exactly
    # (one scale per 16, the extreme -32 in each group, d = 1/127 of the
    # largest scale), then check the bytes' sizes and the round trip.
    rng = np.random.default_rng(4)
    q = rng.integers(-31, 32, (2, 2 * SUPER))
    q.reshape(2, -1, 16)[..., 5] = -32
    scales = rng.integers(1, 128, (2, 2 * SUPER // 16)).astype(np.float32)
    scales.reshape(2, 2, 16)[..., 0] = 127  # the largest scale of each block
    d = np.float32(np.float16(2.0**-10))
    weights = (q.reshape(2, -1, 16) * (d * -scales)[..., None]).reshape(2, -1).astype(np.float32)
    blocks = quantize_q6_k(weights)
    assert blocks.shape == (2, 2 * 210) and blocks.dtype == np.uint8
    np.testing.assert_array_equal(ENCODINGS["q6_k"].dequantize(blocks), weights)
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q6_k(np.ones((1, 128), np.float32))


def test_q6_k_is_more_precise_than_q4_0():
    weights = np.random.default_rng(5).standard_normal((16, SUPER)).astype(np.float32)
    err = {name: np.abs(e.dequantize(e.quantize(weights)) - weights).max() for name, e in ENCODINGS.items()}
    assert err["q6_k"] < err["q4_0"] / 3


# MAX's kernels on our blocks (each encoding's layer, what the course's blocks get as ``linear``): in
# test_fast_linear.py, whose one compiled graph of layers holds them.


# Measured on trained-bytes by `python -m bench.accuracy`:
#   q4_0: largest |logit error| 7.4% of the largest logit, argmax equal at 96.9%
#         of the reference positions, greedy text equal for 13 of 48 tokens;
#   q6_k: 2.4%, 98.4%, 13 of 48 (both then take a near-tie the other way).
#   q4_0m: 7.1%, 96.1%, 8 of 48 (docs/precision.md has the table).
# The stated tolerances, with some room for other CPUs' rounding:
# (logit error / largest logit, argmax agreement)
TOLERANCE = {"q4_0": (0.10, 0.95), "q4_0m": (0.10, 0.95), "q6_k": (0.04, 0.97)}
GREEDY_PREFIX = {"q4_0": 10, "q4_0m": 8, "q6_k": 10}


@pytest.fixture(scope="module")
def trained_builds():
    """trained-bytes in each quantized precision and in float32 (their graphs
    compiled as one unit before this file's tests: tests/suite_graphs.py)."""
    from model.gpt2 import load_gpt2

    folder, _, arrays = reference("trained-bytes")
    dtypes = [*sorted(TOLERANCE), "float32"]
    return {dtype: load_gpt2(folder, device="cpu", dtype=dtype, with_tokenizer=False) for dtype in dtypes}, arrays


@pytest.fixture(params=sorted(TOLERANCE))
def trained(request, trained_builds):
    builds, arrays = trained_builds
    return builds[request.param], arrays


def test_quantized_logits_stay_close(trained):
    gpt2, ref = trained
    error, agreement = TOLERANCE[gpt2.placement.dtype]
    logits = gpt2.forward_logits(ref["ids"])
    assert np.abs(logits - ref["logits"]).max() <= error * np.abs(ref["logits"]).max()
    assert (logits.argmax(-1) == ref["logits"].argmax(-1)).mean() >= agreement


def test_quantized_greedy_starts_like_hugging_face(trained):
    gpt2, ref = trained
    n = GREEDY_PREFIX[gpt2.placement.dtype]
    tokens, _ = greedy(gpt2, ref["prompt"], n)
    assert tokens[0].tolist() == ref["greedy"][0, :n].tolist()


def test_float32_equals_hugging_face_on_the_trained_checkpoint(trained_builds):
    builds, ref = trained_builds
    assert np.abs(builds["float32"].forward_logits(ref["ids"]) - ref["logits"]).max() <= 1e-4


@pytest.fixture(scope="module")
def demo_on_two_paths():
    """The demo in q8_0 and q4_0 on this CPU's own kernel path ("auto") and
    on another it can run (AVX2 where this CPU has AVX-512, portable where it
    has AVX2 only), by (dtype, path)."""
    from suite_graphs import other_path

    from model import cpu
    from model.gpt2 import load_gpt2
    from weights import resolve_model

    other, demo, builds = other_path(), resolve_model("demo"), {}
    if other is None:
        pytest.skip("this CPU runs one kernel path only")
    for dtype in ("q8_0", "q4_0"):
        for path in ("auto", other):
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv(cpu.ENV, path)  # read when the graph is named and its layers built
                builds[dtype, path] = load_gpt2(demo, device="cpu", dtype=dtype, with_tokenizer=False)
    return other, builds


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_another_kernel_path_writes_the_same_demo_text(dtype, demo_on_two_paths):
    # Before the AVX2 path, on an AVX2-only CPU q4_0 wrote "!!!!" (MAX's Q4_0 kernel read
    # blocks packed for AVX-512). The demo's greedy continuation on this CPU's
    # own path and on another it can run: the same tokens, logits within float
    # rounding (the 8-bit dot products are exact integers on every path).
    from checkpoints import demo_reference

    other, builds = demo_on_two_paths
    ref = demo_reference()
    runs = {path: (builds[dtype, path].forward_logits(ref["ids"]),
                   greedy(builds[dtype, path], ref["prompt"], 12)[0][0].tolist()) for path in ("auto", other)}
    (auto_logits, auto_tokens), (other_logits, other_tokens) = runs["auto"], runs[other]
    assert other_tokens == auto_tokens and 0 not in auto_tokens  # token 0 is "!"
    assert np.abs(other_logits - auto_logits).max() <= 1e-3 * np.abs(auto_logits).max()


def test_quantizing_lets_go_of_the_float32_pages(tmp_path):
    # A first quantized run's peak memory: each matrix read from a mapped file
    # is quantized, then its pages leave the process's resident memory.
    from test_weights import resident_pages

    from model.quantize import quantize_state

    weight = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    np.save(tmp_path / "w.npy", weight)
    mapped = np.load(tmp_path / "w.npy", mmap_mode="c")
    assert resident_pages(mapped) == 0
    out = quantize_state({"h.0.mlp.c_fc": ["q8_0", ["weight", "scales"], None]}, {"h.0.mlp.c_fc.weight": mapped})
    assert out["h.0.mlp.c_fc.weight"].dtype == np.int8 and resident_pages(mapped) == 0
    np.testing.assert_array_equal(mapped, weight)  # still readable: the pages come back from the file
