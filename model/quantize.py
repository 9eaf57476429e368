"""Weight-only quantization (GGUF's Q8_0, Q6_K and Q4_0) for the CPU: the formats, in numpy.

Why: decoding one token at batch 1 reads every weight once, so its speed is
the memory bandwidth divided by the bytes of weights (fp32 GPT-2 124M is
~500 MB per token); fewer bytes a weight is the lever. Which kernel runs
each format:

    q8_0   model/layers/q8_0.py: this project's op (model/kernels/matmul.mojo),
           any number of rows: MAX has no 8-bit matmul that keeps float32 results
    q4_0   model/layers/q4_0.py: this project's op (model/kernels/q4_0.mojo)
           over the layout MAX's Q4_0 kernel reads (``pack_q4_0``): its own
           prefetching kernel for one row, MAX's kernel for a prompt where
           the band is MAX's
    q6_k   model/layers/qmatmul.py: MAX's ``F.qmatmul`` on the GGUF blocks as they are

The ops are one call per layer, so MAX fuses the bias add (and gelu) into
them. Why these routes and not bfloat16, an int8 cast in the graph, MAX's int8
matmul or F.qmatmul for q4_0: docs/decisions/0003-own-q8_0-q4_0-kernels.md.

Q8_0 (ggml's ``block_q8_0``, 8.5 bits a weight): every 32 consecutive
weights share one float16 scale ``d = max|w| / 127``; a weight is
``code * d`` with an int8 code. ggml stores d then the 32 codes in one
block; here the codes (int8) and the scales (float16) are two arrays (the
same numbers; aligned vector loads in the kernel), each tile of 8 output
rows stored as one stream (``interleave_q8_0``: per block, per step of 4
weights, the 8 rows' codes back to back, so the kernel reads one stream per
tile instead of 8 rows K bytes apart and one dot product instruction
advances the 8 rows). The kernel also rounds the activations to Q8_0 (8 bits per block of 32), as
llama.cpp's q8_0 does, and takes input widths that are a multiple of 64.

Q4_0 (ggml's ``block_q4_0``, 4.5 bits a weight): every 32 consecutive
weights along the input dimension share one float16 scale ``d``; a weight
is ``(q - 8) * d`` with a 4-bit code q. Bytes: d, then 16 bytes whose low
nibbles hold weights 0..15 and high nibbles weights 16..31 (``quantize_q4_0``;
the layer holds the same bytes reordered by ``pack_q4_0``, in bands of rows
whose height depends on the CPU: docs/cpu.md).

Q6_K (``block_q6_K``, 6.6 bits a weight, ~4x smaller error): 256 weights
in 16 groups of 16, each group with an int8 scale, times one float16 ``d``
per block; a weight is ``d * scale * (q - 32)`` with a 6-bit code q.
Bytes: 128 of low 4 bits, 64 of high 2 bits, 16 scales, d (the bit order
follows ggml's ``dequantize_row_q6_K``).

Scales are chosen simply (the value of largest magnitude maps to the most
negative code, as ggml's reference Q4_0 does), not by ggml's error search.

What is quantized: every Linear layer the model is built with, i.e. the
four of every block (c_attn, c_proj, c_fc, mlp.c_proj) and the LM head (a
quantized copy of the tied wte table; the embedding lookup keeps reading the
float32 table, one row per token). The build passes model/layers'
``quantized_linear(enc)`` as the course's ``linear`` maker (steps 04, 07, 11), so the layers are
quantized when they are constructed; ``quantize_state`` then turns the
checkpoint's float32 arrays into blocks for exactly those layers.
Layer norms, biases, position embeddings and activations stay float32.
The kernels also round the activations to 8 bits per block (Q8_0 / Q8_K),
as llama.cpp does. A layer whose input width is not a multiple of the block
stays float32; Q4_0 / Q6_K output rows are padded with zeros to a multiple
of 32 (the vocab, 50257, becomes 50272) and the padded logits are cut off
(q6_k) or never written (q4_0's op).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32
BLOCK_BYTES = 2 + BLOCK // 2
SUPER = 256  # Q6_K
ROW_MULTIPLE = 32
Q8_0_WIDTH_MULTIPLE = 2 * BLOCK  # input widths model/kernels' Q8_0 op takes (two blocks per step)
Q8_0_TILE = 8  # output rows per interleaved tile: model/kernels/matmul.mojo's ROWS


def quantize_q4_0(weight: np.ndarray) -> np.ndarray:
    """[out, in] float -> [out, in // 32 * 18] uint8 Q4_0 blocks."""
    rows, cols = weight.shape
    if cols % BLOCK:
        raise ValueError(f"Q4_0 needs an input width that is a multiple of {BLOCK}, got {cols}")
    blocks = np.asarray(weight, dtype=np.float32).reshape(rows, cols // BLOCK, BLOCK)
    # The value of largest magnitude, with its sign: it maps to code 0 (-8 * d).
    at = np.abs(blocks).argmax(axis=-1)[..., None]
    extreme = np.take_along_axis(blocks, at, axis=-1)
    d = extreme / -8.0
    codes = np.clip(np.trunc(blocks * _inverse(d) + 8.5), 0, 15).astype(np.uint8)
    packed = codes[..., : BLOCK // 2] | (codes[..., BLOCK // 2 :] << 4)
    scale = d.astype(np.float16).view(np.uint8)  # [rows, blocks, 2], little-endian
    return np.concatenate([scale, packed], axis=-1).reshape(rows, -1)


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """The inverse of ``quantize_q4_0`` (up to the rounding): [out, in] float32."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, BLOCK_BYTES)
    d = b[..., :2].copy().view(np.float16).astype(np.float32)
    codes = np.concatenate([b[..., 2:] & 0x0F, b[..., 2:] >> 4], axis=-1).astype(np.float32)
    return ((codes - 8.0) * d).reshape(rows, -1)


def pack_q4_0(blocks: np.ndarray, band: int = ROW_MULTIPLE) -> np.ndarray:
    """Q4_0 blocks [out, in / 32 * 18] (out a multiple of 32) -> the same
    bytes in the layout MAX's Q4_0 kernel reads (its ``matmul_qint4_pack_b``,
    what F.qmatmul's repack op does in the graph), the one
    model/kernels/q4_0.mojo's op takes: per band of ``band`` rows, per block
    of 32 weights, 18 * band bytes: the band's float16 scales, then for j in
    0..3 each row's 4 bytes whose byte t holds codes 8j+t (low nibble) and
    8j+4+t (high). MAX's kernel reads bands of twice the target's float32
    vector width (model/cpu.py's q4_0_band: 32 rows with AVX-512, 16 with AVX2)."""
    rows = blocks.shape[0]
    if rows % ROW_MULTIPLE:
        raise ValueError(f"Q4_0 packing takes whole blocks of {ROW_MULTIPLE} rows, got {rows}")
    if band not in (8, 16, 32):
        raise ValueError(f"Q4_0 bands are 8, 16 or 32 rows, not {band}")
    b = blocks.reshape(rows // band, band, -1, BLOCK_BYTES)  # [band, row, group, bytes]
    codes = np.concatenate([b[..., 2:] & 0x0F, b[..., 2:] >> 4], axis=-1)  # codes 0..31 in order
    codes = codes.reshape(*codes.shape[:3], 4, 2, 4)  # [band, row, group, j, low / high, t]
    tuples = codes[..., 0, :] | (codes[..., 1, :] << 4)  # [band, row, group, j, t]
    # [band, group, j * row * t]
    tuples = tuples.transpose(0, 2, 3, 1, 4).reshape(*tuples.shape[:1], tuples.shape[2], -1)
    scales = b[..., :2].transpose(0, 2, 1, 3).reshape(tuples.shape[0], tuples.shape[1], -1)  # [band, group, row * 2]
    return np.concatenate([scales, tuples], axis=-1).reshape(rows, -1)


Q6_K_BYTES = 128 + 64 + 16 + 2  # low 4 bits, high 2 bits, 16 int8 scales, float16 d


def quantize_q6_k(weight: np.ndarray) -> np.ndarray:
    """[out, in] float -> [out, in // 256 * 210] uint8 Q6_K blocks."""
    rows, cols = weight.shape
    if cols % SUPER:
        raise ValueError(f"Q6_K needs an input width that is a multiple of {SUPER}, got {cols}")
    nb = cols // SUPER
    x = np.asarray(weight, np.float32).reshape(rows, nb, 16, 16)  # [row, block, group, 16]
    # Each group's scale: its value of largest magnitude maps to code -32.
    at = np.abs(x).argmax(-1)[..., None]
    group_scale = np.take_along_axis(x, at, -1)[..., 0] / -32.0  # [row, block, 16]
    # The groups' scales as int8 multiples of one float16 d per block.
    d = (np.abs(group_scale).max(-1, keepdims=True) / 127.0).astype(np.float16).astype(np.float32)
    scales = np.clip(np.rint(group_scale * _inverse(d)), -128, 127).astype(np.int8)
    step = (d * scales)[..., None]  # [row, block, 16, 1]
    q = (np.clip(np.rint(x * _inverse(step)), -32, 31) + 32).astype(np.uint8)
    # ggml's bit order: each half block of 128 weights is 4 runs of 32 (r = 0..3);
    # runs 0 and 1 fill the low nibbles of 64 ql bytes, runs 2 and 3 their high
    # nibbles, and the four runs' top 2 bits share 32 qh bytes.
    q = q.reshape(rows, nb, 2, 4, 32)
    low, high = q & 0x0F, q >> 4
    ql = np.concatenate([low[:, :, :, 0] | (low[:, :, :, 2] << 4), low[:, :, :, 1] | (low[:, :, :, 3] << 4)], -1)
    qh = high[:, :, :, 0] | (high[:, :, :, 1] << 2) | (high[:, :, :, 2] << 4) | (high[:, :, :, 3] << 6)
    out = np.concatenate([ql.reshape(rows, nb, 128), qh.reshape(rows, nb, 64), scales.view(np.uint8),
                          d.astype(np.float16).view(np.uint8)], -1)
    return out.reshape(rows, -1)


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """The inverse of ``quantize_q6_k`` (up to the rounding): [out, in] float32."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, Q6_K_BYTES)
    ql = b[..., :128].reshape(rows, -1, 2, 64)
    qh = b[..., 128:192].reshape(rows, -1, 2, 32)
    scales = b[..., 192:208].copy().view(np.int8).astype(np.float32)
    d = b[..., 208:210].copy().view(np.float16).astype(np.float32)
    low = np.stack([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], -2)
    high = np.stack([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], -2)
    q = ((low | (high << 4)).astype(np.float32) - 32).reshape(rows, -1, 16, 16)
    return (q * (d * scales)[..., None]).reshape(rows, -1)


def quantize_q8_0(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[out, in] float -> (codes [out, in] int8, scales [out, in // 32] float16), as ggml's
    ``quantize_row_q8_0_ref``: d = max|w| / 127 per block, code = round(w / d)."""
    rows, cols = weight.shape
    if cols % BLOCK:
        raise ValueError(f"Q8_0 needs an input width that is a multiple of {BLOCK}, got {cols}")
    blocks = np.asarray(weight, dtype=np.float32).reshape(rows, cols // BLOCK, BLOCK)
    d = np.abs(blocks).max(axis=-1) / 127.0
    codes = np.clip(np.rint(blocks * _inverse(d)[..., None]), -127, 127).astype(np.int8)
    return codes.reshape(rows, cols), d.astype(np.float16)


def dequantize_q8_0(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The inverse of ``quantize_q8_0`` (up to the rounding): [out, in] float32."""
    rows, cols = codes.shape
    blocks = codes.reshape(rows, cols // BLOCK, BLOCK).astype(np.float32)
    return (blocks * scales.astype(np.float32)[..., None]).reshape(rows, cols)


def interleave_q8_0(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 codes [N, K] and scales [N, K / 32] -> the layout model/kernels'
    op reads: rows padded with zeros to whole tiles of Q8_0_TILE; codes
    [tiles, K * 8] (per tile, block of 32 and step of 4 weights, the 8 rows'
    4 codes back to back), scales [tiles, K / 4] (per block, the 8 rows')
    as their float16 bits, uint16: MAX 26.7 refuses a float16 tensor in a
    graph compiled for an Arm CPU ("The f16 data type is not supported on
    device 'cpu:0'"), so the op takes the bits and reads them as float16 itself."""
    n, k = codes.shape
    tiles = -(-n // Q8_0_TILE)
    blocks = k // BLOCK
    codes = np.pad(codes, ((0, tiles * Q8_0_TILE - n), (0, 0)))
    scales = np.pad(scales, ((0, tiles * Q8_0_TILE - n), (0, 0)))
    # tile, block, step, row, code
    steps = codes.reshape(tiles, Q8_0_TILE, blocks, BLOCK // 4, 4).transpose(0, 2, 3, 1, 4)
    return (np.ascontiguousarray(steps).reshape(tiles, -1),
            np.ascontiguousarray(scales.reshape(tiles, Q8_0_TILE, blocks).transpose(0, 2, 1))
            .reshape(tiles, -1).astype(np.float16).view(np.uint16))


def _inverse(a: np.ndarray) -> np.ndarray:
    """1 / a, with 0 where a is 0 (an all-zero group or block)."""
    return np.divide(1.0, a, out=np.zeros_like(a), where=a != 0)


@dataclass(frozen=True)
class Encoding:
    block: int  # weights per block along the input dimension
    block_bytes: int  # bytes per block
    quantize: object
    dequantize: object
    max_name: str  # the QuantizationEncoding member


ENCODINGS = {
    "q4_0": Encoding(BLOCK, BLOCK_BYTES, quantize_q4_0, dequantize_q4_0, "Q4_0"),
    "q6_k": Encoding(SUPER, Q6_K_BYTES, quantize_q6_k, dequantize_q6_k, "Q6_K"),
}


def padded_rows(rows: int) -> int:
    """MAX's kernels want whole blocks of 32 output rows: padded rows are zeros, cut off after."""
    return -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE


def with_padded_rows(weight: np.ndarray) -> np.ndarray:
    """A float32 weight [out, in] with zero rows up to ``padded_rows(out)``."""
    rows = weight.shape[0]
    if padded_rows(rows) == rows:
        return weight
    return np.concatenate([weight, np.zeros((padded_rows(rows) - rows, weight.shape[1]), np.float32)])


def quantized_arrays(encoding: str, weight: np.ndarray, band: int | None = None) -> dict[str, np.ndarray]:
    """One layer's float32 weight [out, in] as the arrays it holds (its
    ``arrays``), by name; q4_0's packed in bands of ``band`` rows (default: the
    band of the CPU compiled for, as Q4_0Linear reads them by default)."""
    if encoding == "q8_0":
        codes, scales = interleave_q8_0(*quantize_q8_0(weight))
        return {"weight": codes, "scales": scales}
    blocks = ENCODINGS[encoding].quantize(with_padded_rows(weight))
    if encoding != "q4_0":
        return {"weight": blocks}
    from model import cpu

    return {"weight": pack_q4_0(blocks, band or cpu.q4_0_band())}


def quantize_state(specs: dict[str, list], state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``state`` (float32, weights [out, in]) with each quantized layer's
    weight (``quantized_specs``) replaced by its arrays: blocks (rows padded
    to a multiple of 32) for q6_k, the same packed for MAX's kernel
    (``pack_q4_0``) for q4_0, codes and scales in tiles of 8 rows for q8_0."""
    from weights.checkpoint import release_pages

    out = dict(state)
    for name, (encoding, _, band) in specs.items():
        weight = np.asarray(state[name + ".weight"], dtype=np.float32)
        out.update({f"{name}.{key}": array for key, array in quantized_arrays(encoding, weight, band).items()})
        # The float32 matrix, replaced by its blocks, was read once from a
        # mapped file (weights/checkpoint.py): its pages need not stay resident.
        release_pages(weight)
    return out


def saved_quantize_state(specs: dict[str, list], state: dict[str, np.ndarray], folder) -> dict[str, np.ndarray]:
    """``quantize_state``, with the blocks saved once per checkpoint and
    encoding: quantizing GPT-2 124M in numpy is seconds of every q4_0 / q6_k
    start, and the result depends only on the checkpoint's files and this
    file's code. Kept as .npy files by model/caches.py (memory-mapped on
    load), keyed by the checkpoint's files, the layers and this file."""
    import hashlib
    from pathlib import Path

    from model import caches

    saved = specs and caches.quantized_arrays(
        folder, hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        *(f"{name}:{encoding}:{band}" for name, (encoding, _, band) in specs.items()))
    if not saved:
        return quantize_state(specs, state)
    names = [f"{name}.{key}" for name, (_, arrays, _) in specs.items() for key in arrays]
    kept = saved.load(names)
    if kept is not None:
        return {**state, **kept}
    out = quantize_state(specs, state)
    saved.save({n: out[n] for n in names})
    return out
