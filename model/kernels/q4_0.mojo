# Q4_0 matmul as a MAX custom op: y = x @ W^T, W in GGUF's Q4_0 blocks laid
# out the way MAX's own Q4_0 kernel reads them.
#
#   few_rows_matmul_q4_0   x [M, K] f32, W [Npad, K / 32 * 18] uint8 -> y [M, N] f32
#                          (Npad = N rounded up to 32; rows past N are zeros)
#                          parameters: isa, isa1 (isa.mojo), band (rows per band),
#                          ahead (groups ahead a band prefetches its stream; 0: none)
#
# The layout is MAX's (`matmul_qint4_pack_b` in MAX's quantization package;
# model/quantize.py's pack_q4_0 writes it in numpy, once per checkpoint):
# per band of B output rows, per group of 32 weights along K, 18 * B bytes:
# the B rows' float16 scales, then 4 chunks of B rows x 4 bytes, where
# chunk j's byte t of a row holds codes 8j+t (low nibble) and 8j+4+t (high).
# B is twice the target's float32 vector width in MAX's kernel: 32 with
# AVX-512, 16 with AVX2, 8 on Arm's NEON. So a band is one contiguous
# stream, and one vector of bytes holds 4 codes of vector-bytes / 4 rows:
# with the input's 4 codes broadcast, one 8-bit dot product (isa.mojo's
# dot4) is 4 products into each of those rows. A weight is (code - 8) * d;
# the -8 is taken out with the input block's code sum (the accumulators
# start at -8 * sum).
#
# Why an op of our own: MAX's F.qmatmul runs this kernel for one row with
# no prefetch, and cannot take the bias add, gelu or residual add that
# follow into itself (each a kernel of its own). This op can stream each
# band with a software prefetch `ahead` groups in front (as the Q8_0 tiles
# do; model/cpu.py chooses it per microarchitecture: some read faster with
# the hardware prefetcher alone), and its output is a fused output, so MAX
# folds what follows into it. For more than one input
# row (a prompt) it calls MAX's own Q4_0 matmul from inside the op when the
# weights are in the band MAX's kernel reads on this target (it unpacks the
# codes once per batch of K and reuses them across input rows); in any other
# band it runs its own band kernel per row, so a layout packed for another
# CPU still gives right answers. `python -m bench.kernels` measures both.

import extensibility
from extensibility import InputTensor
from extensibility import _FusedOutputTensor as FusedOutputTensor
from layout import TileTensor, row_major
from max.gpu.host import DeviceContext
from quantization.qmatmul import matmul_qint4
from std.math import ceildiv
from std.memory import alloc, bitcast, stack_allocation
from std.sys.info import simd_width_of
from std.sys.intrinsics import PrefetchOptions, prefetch
from std.utils.index import IndexList

from .isa import dot4_32, dot4_64, resolved, vector_bytes
from .matmul import F32, Q, deal, flush_in_parallel, q8_0_block

comptime BAND_CHUNK = 4  # bands a core takes at a time (of 32 rows; more of fewer rows)
comptime MAX_BAND = 2 * simd_width_of[F32]()  # the band MAX's own Q4_0 kernel reads on this target


@always_inline
def nibble_dots[isa: Int, VB: Int, L: Int](
    acc: SIMD[DType.int32, L], w: SIMD[DType.uint8, VB], lo: SIMD[DType.int8, VB], hi: SIMD[DType.int8, VB]
) -> SIMD[DType.int32, L]:
    """acc + the dot products of w's low nibbles with lo and its high nibbles
    with hi, 4 bytes a lane (isa.mojo's dot4). The codes are 0..15: no pair
    of products leaves int16 on AVX2."""
    comptime if VB == 64:
        var w64 = rebind[SIMD[DType.uint8, 64]](w)
        var a = dot4_64[isa](rebind[SIMD[DType.int32, 16]](acc), w64 & 15, rebind[SIMD[DType.int8, 64]](lo))
        return rebind[SIMD[DType.int32, L]](dot4_64[isa](a, w64 >> 4, rebind[SIMD[DType.int8, 64]](hi)))
    else:
        comptime assert VB == 32, "vectors of 32 or 64 bytes"
        var w32 = rebind[SIMD[DType.uint8, 32]](w)
        var a = dot4_32[isa](rebind[SIMD[DType.int32, 8]](acc), w32 & 15, rebind[SIMD[DType.int8, 32]](lo))
        return rebind[SIMD[DType.int32, L]](dot4_32[isa](a, w32 >> 4, rebind[SIMD[DType.int8, 32]](hi)))


def group_bytes(band: Int) -> Int:
    """Bytes per group of 32 weights of a band: its float16 scales, then its rows' 16 bytes of codes."""
    return 2 * band + band * Q // 2


@always_inline
def band_q4_0[isa: Int, band: Int, ahead: Int](
    xw: UnsafePointer[Int32, _], xd: UnsafePointer[Float32, _], xc: UnsafePointer[Int32, _],
    bp: UnsafePointer[UInt8, _], y: FusedOutputTensor[dtype=F32, rank=2, ...], G: Int, N: Int, b: Int, m: Int,
):
    """y[m, b * band : +band] for one input row m: xw its Q8_0 codes as words
    of 4, xd each block's scale, xc each block's -8 * (sum of its codes).
    A vector of bytes holds 4 codes of L rows (L = vector bytes / 4, at
    most the band), so a band is `band / L` vectors per chunk. Each group
    prefetches the group `ahead` groups on (none when 0)."""
    comptime VB = 64 if vector_bytes(isa) >= 64 and band >= 16 else 32  # bytes per vector
    comptime L = VB // 4  # rows per vector
    comptime VECS = band // L
    comptime GB = group_bytes(band)
    var acc = stack_allocation[band, Float32]()
    var dots = stack_allocation[band, Int32]()
    comptime for v in range(VECS):
        acc.store(v * L, SIMD[F32, L](0))
    for g in range(G):
        var at = b * G + g
        var gp = bp + at * GB
        comptime for line in range(ceildiv(GB, 64) if ahead > 0 else 0):
            prefetch[PrefetchOptions().for_read().high_locality()](bp + (at + ahead) * GB + line * 64)
        comptime for v in range(VECS):
            dots.store(v * L, SIMD[DType.int32, L](xc[g]))
        comptime for j in range(4):
            var lo = bitcast[DType.int8, VB](SIMD[DType.int32, L](xw[g * 8 + 2 * j]))  # input codes 8j..8j+3
            var hi = bitcast[DType.int8, VB](SIMD[DType.int32, L](xw[g * 8 + 2 * j + 1]))  # 8j+4..8j+7
            comptime for v in range(VECS):
                var w = gp.load[width=VB](2 * band + j * 4 * band + v * VB)
                dots.store(v * L, nibble_dots[isa, VB, L](dots.load[width=L](v * L), w, lo, hi))
        comptime for v in range(VECS):
            var d = gp.bitcast[Float16]().load[width=L](v * L).cast[F32]() * xd[g]
            acc.store(v * L, dots.load[width=L](v * L).cast[F32]().fma(d, acc.load[width=L](v * L)))
    var row = b * band
    if row + band <= N:
        comptime for v in range(VECS):
            y._fused_store[L, 2](IndexList[2](m, row + v * L), acc.load[width=L](v * L))
    else:  # the last band: its padding rows are not outputs
        for l in range(N - row):
            y._fused_store[1, 2](IndexList[2](m, row + l), acc.load[width=1](l))


@extensibility.register("few_rows_matmul_q4_0")
struct FewRowsMatmulQ4_0:
    @staticmethod
    def execute[target: StaticString, isa: Int, isa1: Int, band: Int, ahead: Int](
        y: FusedOutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert band == 8 or band == 16 or band == 32, "bands of 8, 16 or 32 rows"
        comptime I = resolved(isa)
        comptime I1 = resolved(isa1)  # the path for one input row
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var N = y.dim_size(1)
        var padded = w.dim_size(0)
        var bp = w.unsafe_ptr()
        if M == 0:
            return
        comptime if band == MAX_BAND:
            if M > 1:  # a prompt: MAX's Q4_0 matmul into a scratch, then through y's fused store
                var c = alloc[Float32](M * padded)
                matmul_qint4[32](x.to_tile_tensor[DType.int64](), w.to_tile_tensor[DType.int64](),
                                 TileTensor(c, row_major((M, padded))))
                flush_in_parallel(y, c, padded, M, 0, N)
                c.free()
                return
        # Each row's Q8_0 codes (as llama.cpp and MAX's kernel round them),
        # each block's scale, and -8 times each block's code sum.
        var G = K // Q
        var xq = alloc[Int8](M * K)
        var xd = alloc[Float32](M * G)
        var xc = alloc[Int32](M * G)
        var xp = x.unsafe_ptr()
        for g in range(M * G):
            var block = q8_0_block(xp.load[width=Q](g * Q))
            xq.store(g * Q, block[0])
            xd[g] = block[1]
            xc[g] = -8 * block[0].cast[DType.int32]().reduce_add()
        var xw = xq.bitcast[Int32]()
        var bands = padded // band

        def work(start: Int, end: Int) {var M, var K, var G, var N, var xw, var xd, var xc, var bp, var y}:
            for b in range(start, end):
                if M == 1:
                    band_q4_0[I1, band, ahead](xw, xd, xc, bp, y, G, N, b, 0)
                else:
                    for m in range(M):
                        band_q4_0[I, band, ahead](xw + m * (K // 4), xd + m * G, xc + m * G, bp, y, G, N, b, m)

        deal(work, bands, BAND_CHUNK * (32 // band), ctx)  # as many rows a take as 4 bands of 32
        xq.free()
        xd.free()
        xc.free()
