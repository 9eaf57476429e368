"""The app's own matmul kernels (model/kernels/matmul.mojo, used through
model/layers/: FewRowsLinear, Q8_0Linear and Q4_0Linear): the same results as
the course's nn.Linear / numpy, for few rows (the custom op) and many rows
(MAX's matmul), awkward shapes included; and whole models built with them
give the same tokens as models built from step 04's nn.Linear."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from checkpoints import demo_reference, greedy, reference

from model.layers.few_rows import FEW_ROWS
from model.quantize import (
    BLOCK,
    ENCODINGS,
    SUPER,
    dequantize_q4_0,
    dequantize_q8_0,
    interleave_q8_0,
    pack_q4_0,
    quantize_q4_0,
    quantize_q8_0,
)

# Q4_0 blocks that MAX's own repacking op (in every_path's graph) packs for its kernel.
REPACKED = quantize_q4_0(np.random.default_rng(3).standard_normal((64, 128)).astype(np.float32))
# Each quantized encoding's layer in every_path's graph: its input [2, 3, 256], weight [40, 256] and bias.
_rng = np.random.default_rng(3)
ON_OUR_BLOCKS = tuple(_rng.standard_normal(shape).astype(np.float32) for shape in ((2, 3, SUPER), (40, SUPER), (40,)))


def run_on_zeros(compiled, prompt_rows: np.ndarray | None = None) -> list:
    """every_path's graph run with its paths' inputs one row of zeros and ``prompt_rows`` (default one
    row of zeros) into the prompt layer: its outputs, for the tests of the outputs that read no input
    of the paths' (the prompt layer, each encoding's layer, MAX's repacking)."""
    from max.experimental.tensor import Tensor

    prompt_rows = np.zeros((1, 64), np.float32) if prompt_rows is None else prompt_rows
    inputs = np.zeros((1, 1, 48), np.float32), np.zeros((1, 1, 128), np.float32), prompt_rows
    return compiled(*(Tensor.from_dlpack(array) for array in inputs))


def test_q8_0_is_ggml_s_rounding():
    # d = max|w| / 127 per block of 32 (float16), code = round(w / d).
    w = np.random.default_rng(0).standard_normal((3, 4 * BLOCK)).astype(np.float32)
    codes, scales = quantize_q8_0(w)
    assert codes.dtype == np.int8 and scales.dtype == np.float16 and scales.shape == (3, 4)
    d = np.abs(w.reshape(3, 4, BLOCK)).max(-1) / 127
    np.testing.assert_array_equal(scales, d.astype(np.float16))
    assert np.abs(codes).max() == 127
    # half a step of rounding, plus the float16 rounding of d (up to 127 steps of it)
    step = d[..., None]
    assert (np.abs(dequantize_q8_0(codes, scales) - w).reshape(3, 4, BLOCK) <= step * (0.5 + 127 * 2**-11)).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(np.ones((2, 48), np.float32))
    assert not dequantize_q8_0(*quantize_q8_0(np.zeros((2, BLOCK), np.float32))).any()


def test_the_interleaved_q8_0_layout_keeps_every_code_and_scale_where_the_kernel_reads_it():
    # model/kernels/matmul.mojo's tile_q8_0 reads tile t, block b, step s,
    # row i's 4 codes at ((t * blocks + b) * 8 + s) * 32 + 4 * i and its
    # scale at (t * blocks + b) * 8 + i.
    from model.quantize import Q8_0_TILE

    n, k = 13, 128  # a last tile of 5 rows: padded with zero rows
    codes = np.arange(n * k).astype(np.int8).reshape(n, k)
    scales = np.arange(n * k // 32).astype(np.float16).reshape(n, k // 32)
    packed_codes, packed_scales = interleave_q8_0(codes, scales)
    assert Q8_0_TILE == 8
    assert packed_codes.shape == (2, 8 * k) and packed_scales.shape == (2, 8 * k // 32)
    assert packed_scales.dtype == np.uint16  # float16 bits: no float16 tensor in the graph (Arm CPUs refuse one)
    flat_codes, flat_scales, blocks = packed_codes.reshape(-1), packed_scales.view(np.float16).reshape(-1), k // 32
    for row in range(2 * 8):
        t, i = divmod(row, 8)
        for b in range(blocks):
            for s in range(8):
                at = ((t * blocks + b) * 8 + s) * 32 + 4 * i
                want = codes[row, b * 32 + 4 * s:b * 32 + 4 * s + 4] if row < n else np.zeros(4, np.int8)
                np.testing.assert_array_equal(flat_codes[at:at + 4], want)
            want = scales[row, b] if row < n else 0
            assert flat_scales[(t * blocks + b) * 8 + i] == want


def max_pack_b(blocks: np.ndarray, n_groups: int) -> np.ndarray:
    """MAX's ``matmul_qint4_pack_b`` (its quantization package) transcribed
    loop for loop: per band of n_groups rows (2 x the target's float32
    lanes), per block, the band's scales, then per 8 codes each row's 4-byte
    tuple (codes t and t + 4 in a byte's low and high nibble)."""
    rows, width = blocks.shape
    groups = width // 18
    out = np.zeros(rows * width, np.uint8)
    for n in range(0, rows, n_groups):
        base = n * width
        for nn in range(n_groups):
            at = base
            for g in range(groups):
                block = blocks[n + nn, g * 18:(g + 1) * 18]
                out[at + 2 * nn:at + 2 * nn + 2] = block[:2]
                at += 2 * n_groups
                codes = np.concatenate([block[2:] & 15, block[2:] >> 4])
                for i in range(0, 32, 8):
                    out[at + 4 * nn:at + 4 * nn + 4] = codes[i:i + 4] | (codes[i + 4:i + 8] << 4)
                    at += 4 * n_groups
    return out.reshape(rows, width)


@pytest.mark.parametrize("band", [8, 16, 32])
def test_the_packed_q4_0_layout_is_max_s_for_every_band(band):
    # model/kernels/q4_0.mojo reads band b, block g's 18 * band bytes at
    # (b * groups + g) * 18 * band: row i's float16 scale at 2 * i, then chunk
    # j's 4 bytes of row i at 2 * band + j * 4 * band + 4 * i, byte t = code
    # 8j+t | code 8j+4+t << 4: MAX's own layout for a target whose float32
    # vector has band / 2 lanes (AVX-512 32, AVX2 16, NEON 8).
    rows, k = 64, 96
    blocks = quantize_q4_0(np.random.default_rng(2).standard_normal((rows, k)).astype(np.float32))
    packed = pack_q4_0(blocks, band)
    assert packed.shape == blocks.shape and packed.dtype == np.uint8
    np.testing.assert_array_equal(packed, max_pack_b(blocks, band))
    flat, groups = packed.reshape(-1), k // BLOCK
    row, g = 37, 2  # one code and scale by the kernel's own arithmetic
    b, i = divmod(row, band)
    at = (b * groups + g) * 18 * band
    assert flat[at + 2 * i:at + 2 * i + 2].tobytes() == blocks[row, g * 18:g * 18 + 2].tobytes()
    codes = np.concatenate([blocks[row, g * 18 + 2:(g + 1) * 18] & 15, blocks[row, g * 18 + 2:(g + 1) * 18] >> 4])
    for j in range(4):
        got = flat[at + 2 * band + j * 4 * band + 4 * i:][:4]
        np.testing.assert_array_equal(got & 15, codes[8 * j:8 * j + 4])
        np.testing.assert_array_equal(got >> 4, codes[8 * j + 4:8 * j + 8])
    with pytest.raises(ValueError, match="blocks of 32"):
        pack_q4_0(blocks[:40], band)


def test_the_q4_0_band_is_the_one_max_repacks_to_on_this_cpu(every_path):
    # MAX's own repack op (what F.qmatmul runs in the graph) on this machine
    # against pack_q4_0 in the band model/cpu.py names for it: the layout the
    # prompt path hands to MAX's Q4_0 kernel. An AVX2 machine checks its
    # band of 16 here, an AVX-512 one its 32. The op is in the graph of the
    # layers' tests below (one compile).
    from model.cpu import q4_0_band

    _, (compiled, _, _, _, _) = every_path
    repacked = run_on_zeros(compiled)[-1].to_numpy()
    np.testing.assert_array_equal(repacked.reshape(REPACKED.shape), pack_q4_0(REPACKED, q4_0_band()))


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_max_kernel_reads_our_blocks(encoding, every_path):
    # The layer on our bytes (q6_k: MAX's qmatmul; q4_0: model/kernels' op,
    # MAX's own Q4_0 kernel for these 6 rows, on the blocks packed for it)
    # equals x @ dequantize(W)^T, up to the 8-bit rounding of the
    # activations; 40 output rows are padded to 64. The layers are in the
    # graph of the layers' tests below (one compile).
    paths, (compiled, _, _, _, _) = every_path
    first = 4 * len(paths) + 1  # after every path's four layers and the prompt layer
    got = run_on_zeros(compiled)[first + sorted(ENCODINGS).index(encoding)].to_numpy()
    x, weight, bias = ON_OUR_BLOCKS
    fmt = ENCODINGS[encoding]
    want = x @ fmt.dequantize(fmt.quantize(weight)).T + bias
    assert got.shape == (2, 3, 40)
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()


def kernel_paths() -> list:
    """"auto" (the CPU's own paths) and every forced path but one that
    compiles the same code as auto for every op: each runs where this CPU can
    execute it, so an AVX-512 machine also runs the AVX2 and portable paths."""
    from model import cpu

    out = []

    def same_as_auto(path: str) -> bool:
        return all(cpu.op_paths(path, op) == cpu.op_paths("auto", op).resolved() for op in cpu.OPS)

    for path in ["auto", *(p for p in cpu.NEEDS if cpu.missing(p) or not same_as_auto(p))]:
        lacking = cpu.missing(path)
        marks = [pytest.mark.skip(reason=f"this CPU lacks {', '.join(lacking)}")] if lacking else []
        out.append(pytest.param(path, marks=marks, id=path))
    return out


def compiled_layers(*paths: str, prompt_out: int | None = None, repack: np.ndarray | None = None,
                    on_our_blocks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
    """``layers_graph`` compiled alone: the compiled graph, then its arrays, the dense Q8_0 and Q4_0
    weights and the prompt layer's codes and scales."""
    graph, rest = layers_graph(*paths, prompt_out=prompt_out, repack=repack, on_our_blocks=on_our_blocks)
    return (graph.compile(), *rest)


def layers_graph(*paths: str, prompt_out: int | None = None, repack: np.ndarray | None = None,
                 on_our_blocks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
    """One graph holding, for each kernel path in ``paths`` (default
    "auto"), every kernel's layers: float32 48 -> 37 (a width that is not a
    multiple of the 16 lanes, a height not a multiple of the 8-row tile),
    Q8_0 128 -> 37, and Q4_0 128 -> 37 packed in bands of 32 and of 16 rows
    (one of them the band MAX's kernel reads here, which prompts hand to it;
    the other runs this project's band kernel for every row, and prefetches
    its weights where the first does not, or the reverse); rows are
    symbolic. With ``prompt_out``, also a Q8_0 64 -> ``prompt_out`` layer on
    the CPU's own path over a third input [rows, 64]; with ``on_our_blocks``
    (an input, a weight and a bias, all weights of the graph), also each
    quantized encoding's layer (what the course's blocks get as ``linear``)
    on that weight's blocks as model/quantize.py writes them, in ENCODINGS'
    sorted order; with ``repack`` (Q4_0 blocks, a weight of the graph), also
    MAX's own repacking of them, the last output.

    Every path's layers share one weight set and one compile: a graph's
    compile costs about the same whether it holds one path's layers or all
    of them, and a compile alone costs far more than one more graph in a
    unit of the suite's graphs (docs/decisions/0008-suite-graphs-in-units.md).
    Returns the graph, not compiled (model/together.py's Other: four
    outputs per path, in order, then the prompt layer's, each encoding's
    and the repacked blocks, those asked for), and its arrays, the dense
    Q8_0 and Q4_0 weights and the prompt layer's codes and scales.
    (tests/avx2_under_qemu.py compiles the same graph under an emulated CPU.)"""
    from max.driver import CPU
    from max.dtype import DType
    from max.experimental import functional as F
    from max.experimental import nn
    from max.experimental.tensor import Tensor
    from max.graph import TensorType
    from max.graph.ops.quantized import repack_gguf_quantized_weights
    from max.graph.quantization import QuantizationEncoding

    from model.layers import quantized_linear
    from model.layers.few_rows import FewRowsLinear
    from model.layers.q4_0 import Q4_0Linear
    from model.layers.q8_0 import Q8_0Linear
    from model.quantize import quantized_arrays
    from model.together import Other

    paths = paths or ("auto",)
    rng = np.random.default_rng(1)
    arrays = {"f32.weight": rng.standard_normal((37, 48)).astype(np.float32),
              "f32.bias": rng.standard_normal(37).astype(np.float32),
              "q8.bias": rng.standard_normal(37).astype(np.float32)}
    q8_codes, q8_scales = quantize_q8_0(rng.standard_normal((37, 128)).astype(np.float32))
    arrays["q8.weight"], arrays["q8.scales"] = interleave_q8_0(q8_codes, q8_scales)  # 5 tiles, the last padded
    # Q4_0 128 -> 37: rows padded to 64 (two bands of 32, four of 16), the last 27 zeros
    q4_blocks = quantize_q4_0(np.concatenate([rng.standard_normal((37, 128)), np.zeros((27, 128))]).astype(np.float32))
    arrays["q4.weight"], arrays["q4.bias"] = pack_q4_0(q4_blocks, 32), rng.standard_normal(37).astype(np.float32)
    arrays["q4b.weight"], arrays["q4b.bias"] = pack_q4_0(q4_blocks, 16), arrays["q4.bias"]
    weights = {f"paths.{i}.{name}": array for i in range(len(paths)) for name, array in arrays.items()}
    prompt = None
    if prompt_out is not None:
        prompt_rng = np.random.default_rng(7)
        codes, scales = quantize_q8_0(prompt_rng.standard_normal((prompt_out, 64)).astype(np.float32))
        weights["prompt.bias"] = prompt_rng.standard_normal(prompt_out).astype(np.float32)
        weights["prompt.weight"], weights["prompt.scales"] = interleave_q8_0(codes, scales)
        prompt = codes, scales, weights["prompt.bias"]

    class Four(nn.Module):
        def __init__(self, path):
            super().__init__()
            self.f32 = FewRowsLinear(48, 37, path=path)
            self.q8 = Q8_0Linear(128, 37, path=path)
            self.q4 = Q4_0Linear(128, 37, path=path, band=32)
            # the other band with the other prefetch choice: both are compiled on every path
            self.q4b = Q4_0Linear(128, 37, path=path, band=16, prefetch=self.q4.parameters_of_op["ahead"] == 0)

        def forward(self, a, b):
            return self.f32(a), self.q8(b), self.q4(b), self.q4b(b)

    if repack is not None:
        weights["blocks"] = repack
    encodings = sorted(ENCODINGS) if on_our_blocks is not None else []
    if on_our_blocks is not None:
        encoded_x, encoded_weight, encoded_bias = on_our_blocks
        weights["encoded_x"] = encoded_x
        for k, encoding in enumerate(encodings):
            weights |= {f"encoded.{k}.{name}": array
                        for name, array in {**quantized_arrays(encoding, encoded_weight), "bias": encoded_bias}.items()}

    class Layers(nn.Module):
        def __init__(self):
            super().__init__()
            self.paths = nn.ModuleList([Four(path) for path in paths])
            self.prompt = Q8_0Linear(64, prompt_out) if prompt_out is not None else None
            if on_our_blocks is not None:
                self.encoded_x = Tensor.zeros(list(encoded_x.shape), dtype=DType.float32)
                self.encoded = nn.ModuleList([quantized_linear(encoding)(*encoded_weight.shape[::-1])
                                              for encoding in encodings])
            if repack is not None:
                self.blocks = Tensor.zeros(list(repack.shape), dtype=DType.uint8)

        def forward(self, a, b, *x):
            out = tuple(t for four in self.paths for t in four(a, b))
            out += (self.prompt(x[0]),) if self.prompt is not None else ()
            out += tuple(layer(self.encoded_x) for layer in self.encoded) if encodings else ()
            return out + ((F.functional(repack_gguf_quantized_weights)(self.blocks, QuantizationEncoding.Q4_0),)
                          if repack is not None else ())

    with F.lazy():
        layers = Layers()
    types = [TensorType(DType.float32, ["batch", "seq", width], device=CPU()) for width in (48, 128)]
    if prompt_out is not None:
        types.append(TensorType(DType.float32, ["rows", 64], device=CPU()))
    return Other(layers, types, weights), (arrays, dequantize_q8_0(q8_codes, q8_scales),
                                           dequantize_q4_0(q4_blocks)[:37], prompt)


def runnable_paths() -> list[str]:
    """kernel_paths() that this CPU can run, as the compiled graph holds them."""
    from model import cpu

    return [p.values[0] for p in kernel_paths() if not cpu.missing(p.values[0])]


@cache
def every_path_graph():
    """layers_graph for every path this CPU can run, the prompt layer, each quantized encoding's
    layer and MAX's repacking (tests/suite_graphs.py compiles it in a unit of the suite's graphs):
    made once per process, so that its name is traced once."""
    return layers_graph(*runnable_paths(), prompt_out=matmul_constant("DEQUANT_BAND") + 77, repack=REPACKED,
                        on_our_blocks=ON_OUR_BLOCKS)


@pytest.fixture(scope="module")
def every_path():
    """every_path_graph's paths, and its compiled graph and arrays as compiled_layers gives them: the
    graph as the suite's unit saved it (found by what it computes), or compiled alone in a run
    without saved graphs."""
    from model import caches

    graph, rest = every_path_graph()
    run = graph.saved()
    assert run is not None or not caches.enabled(), "tests/suite_graphs.py's unit did not save this graph"
    return runnable_paths(), (run or graph.compile(), *rest)


@pytest.fixture(params=kernel_paths())
def layers(request, every_path):
    """One kernel path's layers ("auto" resolved to its name) as a function of
    the two inputs, run through the graph that holds every path's."""
    from max.experimental.tensor import Tensor

    from model import cpu

    paths, (compiled, arrays, q8_dense, q4_dense, _) = every_path
    i = paths.index(request.param)
    one_row = Tensor.from_dlpack(np.zeros((1, 64), np.float32))  # the prompt layer's input, unused here

    def run(a, b):
        out = compiled(Tensor.from_dlpack(a), Tensor.from_dlpack(b), one_row)
        return [t.to_numpy() for t in out[4 * i: 4 * i + 4]]

    return (cpu.native_path() if request.param == "auto" else request.param), (run, arrays, q8_dense, q4_dense)


def matmul_constant(name: str) -> int:
    """A ``comptime NAME = <int>`` of matmul.mojo (Mojo cannot import Python's, nor Python Mojo's)."""
    import re

    from model.layers.custom_op import KERNELS

    source = (KERNELS / "matmul.mojo").read_text()
    return int(re.search(rf"^comptime {name} = (\d+)", source, re.M).group(1))


# The input rows above which a prompt's Q8_0 product is MAX's float32 matmul
# on the dequantized weights, per kernel path (matmul.mojo's
# q8_0_dequantize_above): the paths without an 8-bit dot product instruction.
Q8_0_DEQUANTIZE_ABOVE = {"avx2": matmul_constant("Q8_0_AVX2_TILES_UP_TO"), "portable": FEW_ROWS}


def q8_0_dequantized(path: str, rows: int) -> bool:
    return rows > Q8_0_DEQUANTIZE_ABOVE.get(path, rows)


@pytest.mark.parametrize("batch, seq", [(1, 1), (1, 3), (1, 7), (2, 5), (1, FEW_ROWS), (1, FEW_ROWS + 1), (3, 20),
                                        (1, Q8_0_DEQUANTIZE_ABOVE["avx2"]), (1, Q8_0_DEQUANTIZE_ABOVE["avx2"] + 1)])
def test_kernels_equal_numpy_for_few_and_many_rows(layers, batch, seq):
    path, (run, arrays, q8_dense, q4_dense) = layers
    rng = np.random.default_rng(batch * 100 + seq)
    a = rng.standard_normal((batch, seq, 48)).astype(np.float32)
    b = rng.standard_normal((batch, seq, 128)).astype(np.float32)
    got_f32, got_q8, got_q4, got_q4b = run(a, b)
    want_f32 = a @ arrays["f32.weight"].T + arrays["f32.bias"]
    want_q8 = b @ q8_dense.T + arrays["q8.bias"]
    want_q4 = b @ q4_dense.T + arrays["q4.bias"]
    assert got_f32.shape == got_q8.shape == got_q4.shape == got_q4b.shape == (batch, seq, 37)
    assert np.abs(got_f32 - want_f32).max() <= 1e-4 * np.abs(want_f32).max()
    # The Q8_0 and Q4_0 kernels round the activations to 8 bits per block of
    # 32 (as llama.cpp and MAX's Q4_0 kernel do): Q4_0 for any number of rows
    # (this project's kernel for one row, and for more where the band is not
    # the one MAX's kernel reads; MAX's kernel otherwise), Q8_0 up to
    # FEW_ROWS rows everywhere, up to Q8_0_DEQUANTIZE_ABOVE's rows on its
    # paths, for any number on the AVX-512 VNNI path. A longer prompt's Q8_0
    # product on those paths keeps float32 activations: numpy's product to
    # float rounding; the rounded activations are ~1e-3-1e-2 off, so the
    # error tells the two routes apart.
    q8_error = np.abs(got_q8 - want_q8).max() / np.abs(want_q8).max()
    if q8_0_dequantized(path, batch * seq):
        assert q8_error <= 1e-4
    else:
        assert 1e-4 < q8_error <= 0.01
    for got in (got_q4, got_q4b):
        assert np.abs(got - want_q4).max() <= 0.01 * np.abs(want_q4).max()


def test_a_prompt_s_q8_0_product_over_several_bands_equals_numpy(every_path):
    # A prompt (more rows than any path's Q8_0_DEQUANTIZE_ABOVE) against more
    # weight rows than one of matmul.mojo's DEQUANT_BAND, the band the AVX2 and
    # portable paths dequantize at a time, the last band ending inside a tile
    # of 8 (a band, 9 tiles and 5 rows): numpy's product on this CPU's own
    # path (GPT-2's LM head is such a product). The layer is in the graph of
    # the test above.
    from model import cpu

    paths, (compiled, _, _, _, (codes, scales, bias)) = every_path
    rows = max(Q8_0_DEQUANTIZE_ABOVE.values()) + 4
    x = np.random.default_rng(8).standard_normal((rows, 64)).astype(np.float32)
    got = run_on_zeros(compiled, x)[4 * len(paths)].to_numpy()
    want = x @ dequantize_q8_0(codes, scales).T + bias
    bound = 1e-4 if q8_0_dequantized(cpu.native_path(), rows) else 0.01  # see the test above
    assert got.shape == want.shape and np.abs(got - want).max() <= bound * np.abs(want).max()


def greedy_tokens(gpt2, prompt: np.ndarray, n: int) -> list[int]:
    return greedy(gpt2, prompt, n)[0][0].tolist()


def test_custom_and_course_linear_give_the_same_tokens():
    # The float32 CPU model on the custom kernels (the default) against one
    # built from step 04's nn.Linear (--linear course): equal logits and greedy tokens.
    from model.gpt2 import load_gpt2

    folder, _, ref = reference("tiny-2l-4h")
    custom = load_gpt2(folder, device="cpu", with_tokenizer=False)  # the default
    course = load_gpt2(folder, device="cpu", linear="course", with_tokenizer=False)
    assert np.abs(custom.forward_logits(ref["ids"]) - course.forward_logits(ref["ids"])).max() <= 1e-5
    assert greedy_tokens(custom, ref["prompt"], 12) == greedy_tokens(course, ref["prompt"], 12)


def q8_0_model(name: str):
    from model.gpt2 import load_gpt2

    if name == "demo":
        from weights import resolve_model

        folder, ref = resolve_model("demo"), demo_reference()
    else:
        folder, _, ref = reference(name)
    return load_gpt2(folder, device="cpu", dtype="q8_0", with_tokenizer=False), ref


@pytest.mark.parametrize("name", ["trained-bytes", "demo"])
def test_q8_0_greedy_tokens_equal_float32_on_trained_checkpoints(name):
    # The bar for an 8-bit format: greedy tokens equal fp32's (the HF
    # reference continuation, which fp32 equals) on the trained checkpoints.
    gpt2, ref = q8_0_model(name)
    assert gpt2.quantized_layers == 4 * gpt2.config.n_layer + 1  # every Linear, the LM head too
    assert greedy_tokens(gpt2, ref["prompt"], ref["greedy"].shape[1]) == ref["greedy"][0].tolist()


@pytest.fixture(scope="module")
def random_q8_0():
    """The two random reference checkpoints in q8_0, by name."""
    from model.gpt2 import load_gpt2

    names = ["tiny-2l-4h", "tiny-3l-3h"]
    return {name: (load_gpt2(reference(name)[0], device="cpu", dtype="q8_0", with_tokenizer=False), reference(name)[2])
            for name in names}


@pytest.mark.parametrize("name", ["tiny-2l-4h", "tiny-3l-3h"])
def test_q8_0_on_random_checkpoints_stays_near_the_reference(name, random_q8_0):
    # Random weights give near-uniform logits, where any rounding flips a
    # near-tie: free-running greedy text leaves HF's after 3 (tiny-2l-4h) and
    # 10 (tiny-3l-3h) of 24 tokens (python -m bench.accuracy; llama.cpp's q8_0
    # rounds activations the same way). On the reference input (2 x 16
    # positions) one top token flips in each checkpoint, where HF's top two
    # logits are 0.006 and 0.004 apart. What holds: the logits within 5% of
    # their scale (measured: 3.4% and 1.2%, activations and weights both
    # rounded to 8 bits), the top token at all but 2 of the 32 positions,
    # and the first tokens of greedy.
    gpt2, ref = random_q8_0[name]
    logits = gpt2.forward_logits(ref["ids"])
    assert np.abs(logits - ref["logits"]).max() <= 0.05 * np.abs(ref["logits"]).max()
    assert (logits.argmax(-1) != ref["logits"].argmax(-1)).sum() <= 2
    assert greedy_tokens(gpt2, ref["prompt"], 3) == ref["greedy"][0, :3].tolist()


def test_the_python_few_rows_is_the_kernel_s():
    # The float32 op picks its own tiles or MAX's matmul inside itself at
    # matmul.mojo's FEW_ROWS; the tests above put their row counts on both
    # sides of it through few_rows.py's copy.
    assert matmul_constant("FEW_ROWS") == FEW_ROWS


def test_the_kernel_library_is_compiled_once_per_source(tmp_path, monkeypatch):
    """model/kernels is precompiled into one .mojoc named by its sources (MAX
    would run `mojo precompile` at every session and call given the folder).
    The naming and reuse are tried on a one-function package (model/kernels'
    own precompile takes much longer)."""
    from model import caches
    from model.layers import custom_op

    library = custom_op.kernel_library()
    assert library.parent == caches.folder("kernels") and library.name.startswith("kernels_") and library.is_file()
    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path / "cache"))
    package = tmp_path / "tiny"
    package.mkdir()
    (package / "__init__.mojo").write_text("")
    (package / "add.mojo").write_text("def add(a: Int, b: Int) -> Int:\n    return a + b\n")
    library = custom_op.mojo_library(package)
    assert library.suffix == ".mojoc" and library.parent == tmp_path / "cache" / "kernels"
    assert library.stat().st_size > 100
    built = library.stat().st_mtime_ns
    assert custom_op.mojo_library(package) == library and library.stat().st_mtime_ns == built  # reused, not rebuilt
    # No staging folder left: the library and its digest (a damaged one is found and made again).
    assert sorted(p.name for p in library.parent.iterdir()) == [library.name, library.name + ".sha256"]
    (package / "add.mojo").write_text("def add(a: Int, b: Int) -> Int:\n    return b + a\n")  # another version
    other = custom_op.mojo_library(package)
    assert other != library and other.is_file()
