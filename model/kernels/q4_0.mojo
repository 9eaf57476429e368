# Q4_0 matmul as a MAX custom op: y = x @ W^T, W in GGUF's Q4_0 blocks laid
# out the way MAX's own Q4_0 kernel reads them.
#
#   few_rows_matmul_q4_0   x [M, K] f32, W [Npad, K / 32 * 18] uint8 -> y [M, N] f32
#                          (Npad = N rounded up to 32; rows past N are zeros)
#
# The layout is MAX's (`matmul_qint4_pack_b` in MAX's quantization package;
# model/quantize.py's pack_q4_0 writes it in numpy, once per checkpoint):
# per band of 32 output rows, per group of 32 weights along K, 576 bytes:
# the 32 rows' float16 scales, then 4 chunks of 32 rows x 4 bytes, where
# chunk j's byte t of a row holds codes 8j+t (low nibble) and 8j+4+t (high).
# So a band is one contiguous stream, and one 64-byte load holds 4 codes of
# 16 rows: with the input's 4 codes broadcast, one vpdpbusd is 64 products
# into 16 rows (`dot4`). A weight is (code - 8) * d; the -8 is taken out
# with the input block's code sum (the accumulators start at -8 * sum).
#
# Why an op of our own: MAX's F.qmatmul runs this kernel for one row at
# ~19 GB/s here, with no prefetch, and cannot take the bias add, gelu or
# residual add that follow into itself (each a kernel of its own). This op
# streams each band with a software prefetch (as the Q8_0 tiles do), and its
# output is a fused output, so MAX folds what follows into it. For more
# than one input row (a prompt) it calls MAX's own Q4_0 matmul from inside
# the op (same layout): that kernel unpacks the codes once per batch of K
# and reuses them across input rows, 2-3x faster than this project's tiles
# were for 16-128 rows. `python -m bench.kernels` measures both.

import extensibility
from extensibility import InputTensor
from extensibility import _FusedOutputTensor as FusedOutputTensor
from layout import TileTensor, row_major
from max.algorithm import parallelize
from max.gpu.host import DeviceContext
from quantization.qmatmul import matmul_qint4
from std.memory import alloc, bitcast
from std.sys.intrinsics import PrefetchOptions, prefetch
from std.utils.index import IndexList

from .matmul import F32, Q, TASKS, deal, dot4, flush, q8_0_block

comptime BAND = 32  # output rows per band (MAX's layout)
comptime BAND_CHUNK = 4  # bands a core takes at a time
comptime GROUP_BYTES = 2 * BAND + BAND * Q // 2  # 576: 32 float16 scales, then 32 rows x 16 bytes of codes
# Groups ahead that a band prefetches its stream (the Q8_0 tiles' QPF, whose
# 8 steps ahead are 4 KB; here 8 groups are 4.5 KB). Intel Xeon, a decode
# step's 49 matmuls, one row (`python -m bench.kernels --step --rows 1
# --against <rev>`, 4 alternated rounds): 2.48 ms with it vs 2.75 without
# (1.11x); 4 and 16 groups ahead the same as 8 (1.00x, 1.02x). MAX's own
# kernel on the same bytes (F.qmatmul's): 3.22-3.56 ms, so 1.36-1.60x.
comptime Q4PF = 8


@always_inline
def band_q4_0(
    xw: UnsafePointer[Int32, _], xd: UnsafePointer[Float32, _], xc: UnsafePointer[Int32, _],
    bp: UnsafePointer[UInt8, _], y: FusedOutputTensor[dtype=F32, rank=2, ...], G: Int, N: Int, band: Int,
):
    """y[0, band * 32 : +32] for one input row: xw its Q8_0 codes as words
    of 4, xd each block's scale, xc each block's -8 * (sum of its codes)."""
    var acc0 = SIMD[F32, 16](0)  # rows 0-15 of the band
    var acc1 = SIMD[F32, 16](0)  # rows 16-31
    for g in range(G):
        var at = band * G + g
        var gp = bp + at * GROUP_BYTES
        comptime for line in range(GROUP_BYTES // 64):
            prefetch[PrefetchOptions().for_read().high_locality()](bp + (at + Q4PF) * GROUP_BYTES + line * 64)
        var i0 = SIMD[DType.int32, 16](xc[g])
        var i1 = i0
        comptime for j in range(4):
            var lo = bitcast[DType.int8, 64](SIMD[DType.int32, 16](xw[g * 8 + 2 * j]))  # input codes 8j..8j+3
            var hi = bitcast[DType.int8, 64](SIMD[DType.int32, 16](xw[g * 8 + 2 * j + 1]))  # 8j+4..8j+7
            var w0 = gp.load[width=64](2 * BAND + j * 128)
            var w1 = gp.load[width=64](2 * BAND + j * 128 + 64)
            i0 = dot4(dot4(i0, w0 & 15, lo), w0 >> 4, hi)
            i1 = dot4(dot4(i1, w1 & 15, lo), w1 >> 4, hi)
        var d = bitcast[DType.float16, 32](gp.load[width=64](0)).cast[F32]() * xd[g]
        acc0 = i0.cast[F32]().fma(d.slice[16, offset=0](), acc0)
        acc1 = i1.cast[F32]().fma(d.slice[16, offset=16](), acc1)
    var row = band * BAND
    if row + BAND <= N:
        y._fused_store[16, 2](IndexList[2](0, row), acc0)
        y._fused_store[16, 2](IndexList[2](0, row + 16), acc1)
    else:  # the last band: its padding rows are not outputs
        comptime for l in range(16):
            if row + l < N:
                y._fused_store[1, 2](IndexList[2](0, row + l), SIMD[F32, 1](acc0[l]))
            if row + 16 + l < N:
                y._fused_store[1, 2](IndexList[2](0, row + 16 + l), SIMD[F32, 1](acc1[l]))


@extensibility.register("few_rows_matmul_q4_0")
struct FewRowsMatmulQ4_0:
    @staticmethod
    def execute[target: StaticString](
        y: FusedOutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var N = y.dim_size(1)
        var padded = w.dim_size(0)
        var bp = w.unsafe_ptr()
        if M == 0:
            return
        if M > 1:  # a prompt: MAX's Q4_0 matmul into a scratch, then through y's fused store
            var c = alloc[Float32](M * padded)
            matmul_qint4[32](x.to_tile_tensor[DType.int64](), w.to_tile_tensor[DType.int64](),
                             TileTensor(c, row_major((M, padded))))

            def copy(t: Int) {var M, var N, var padded, var c, var y}:
                var per = (M + TASKS - 1) // TASKS
                flush(y, c, padded, t * per, min(t * per + per, M), 0, N)

            parallelize(copy, TASKS)
            c.free()
            return
        # One row: its Q8_0 codes (as llama.cpp and MAX's kernel round it),
        # each block's scale, and -8 times each block's code sum.
        var G = K // Q
        var xq = alloc[Int8](K)
        var xd = alloc[Float32](G)
        var xc = alloc[Int32](G)
        var xp = x.unsafe_ptr()
        for g in range(G):
            var block = q8_0_block(xp.load[width=Q](g * Q))
            xq.store(g * Q, block[0])
            xd[g] = block[1]
            xc[g] = -8 * block[0].cast[DType.int32]().reduce_add()
        var xw = xq.bitcast[Int32]()
        var bands = padded // BAND

        def work(start: Int, end: Int) {var G, var N, var xw, var xd, var xc, var bp, var y}:
            for band in range(start, end):
                band_q4_0(xw, xd, xc, bp, y, G, N, band)

        deal(work, bands, BAND_CHUNK)  # bands dealt BAND_CHUNK at a time, as in matmul.mojo's ops
        xq.free()
        xd.free()
        xc.free()
