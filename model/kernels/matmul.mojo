# Matmuls for few rows (decode), as MAX custom ops: y = x @ W^T.
#
# Why: decoding one token reads every weight once, so its speed is the rate
# at which the weights stream from memory. MAX 26.7's CPU matmul for a
# [1, K] x [K, N] product tiles and packs W at run time and streamed GPT-2's
# weights at ~11-15 GB/s here, where llama.cpp reaches 26-36 GB/s on the same
# 2 cores. These kernels read W once, in its stored [N, K] layout, each task
# a contiguous band of rows, 4 rows x up to 4 input rows per tile, so every
# weight vector loaded is used for every input row (model/fast_linear.py
# measures and chooses: they are used for up to FEW_ROWS rows, MAX's own
# matmul above that).
#
#   few_rows_matmul_f32   x [M, K] f32, W [N, K] f32             -> y [M, N] f32
#   few_rows_matmul_q8_0  x [M, K] f32, W codes [N, K] int8,
#                         W scales [N, K / 32] f16               -> y [M, N] f32
#
# Q8_0 is GGUF's 8-bit format: every 32 consecutive weights of a row share
# one float16 scale d, a weight is d * code. llama.cpp stores each block as
# d then 32 codes; here codes and scales are two arrays (same numbers,
# aligned vector loads).

import extensibility
from extensibility import InputTensor, OutputTensor
from max.algorithm import parallelize
from max.gpu.host import DeviceContext
from std.memory import alloc, stack_allocation
from std.sys import llvm_intrinsic
from std.sys.info import CompilationTarget

comptime F32 = DType.float32
comptime V = 16  # float32 lanes of one AVX-512 register
comptime Q = 32  # weights per Q8_0 block
comptime ROWS = 4  # weight rows per tile
comptime TASKS = 8  # bands of rows (the runtime spreads them over the cores)


def band(N: Int, t: Int) -> Tuple[Int, Int]:
    """Task t's rows [start, end): whole tiles of ROWS, the last band short."""
    var per = ((N + TASKS - 1) // TASKS + ROWS - 1) // ROWS * ROWS
    return (min(t * per, N), min(t * per + per, N))


@always_inline
def tile_f32[R: Int, MB: Int](
    xp: UnsafePointer[Float32, _], wp: UnsafePointer[Float32, _], yp: UnsafePointer[mut=True, Float32, _],
    K: Int, N: Int, r: Int, m0: Int,
):
    """y[m0:m0+MB, r:r+R] from W rows r..r+R: each W vector is loaded once
    and multiplied into MB accumulators (kept in registers once unrolled)."""
    var acc = stack_allocation[R * MB * V, Float32]()
    comptime for a in range(R * MB):
        acc.store(a * V, SIMD[F32, V](0))
    var kv = K - K % V
    for k in range(0, kv, V):
        comptime for i in range(R):
            var wv = wp.load[width=V]((r + i) * K + k)
            comptime for j in range(MB):
                var a = (i * MB + j) * V
                acc.store(a, wv.fma(xp.load[width=V]((m0 + j) * K + k), acc.load[width=V](a)))
    comptime for i in range(R):
        comptime for j in range(MB):
            var s = acc.load[width=V]((i * MB + j) * V).reduce_add()
            for k in range(kv, K):  # a width that is not a multiple of V
                s += wp.load((r + i) * K + k) * xp.load((m0 + j) * K + k)
            yp.store((m0 + j) * N + r + i, s)


@always_inline
def madd(a: SIMD[DType.int16, Q], b: SIMD[DType.int16, Q]) -> SIMD[DType.int32, Q // 2]:
    """Pairwise a * b summed in int32 (x86's vpmaddwd: one instruction for 32
    products on AVX-512; the portable form elsewhere)."""
    comptime if CompilationTarget.has_avx512f():
        return llvm_intrinsic["llvm.x86.avx512.pmaddw.d.512", SIMD[DType.int32, Q // 2]](a, b)
    else:
        var p = a.cast[DType.int32]() * b.cast[DType.int32]()
        return p.deinterleave()[0] + p.deinterleave()[1]


@always_inline
def tile_q8_0[R: Int, MB: Int](
    xq: UnsafePointer[Int16, _], xd: UnsafePointer[Float32, _], qp: UnsafePointer[Int8, _],
    dp: UnsafePointer[Float16, _], yp: UnsafePointer[mut=True, Float32, _], K: Int, N: Int, r: Int, m0: Int,
):
    """tile_f32 for Q8_0 weights against int16-quantized inputs (xq, one
    float32 scale xd per block of 32): per block, 32 codes x 32 inputs are
    one integer multiply-add into 16 int32 lanes, then scaled by d * xd."""
    comptime H = Q // 2
    var KB = K // Q
    var acc = stack_allocation[R * MB * H, Float32]()
    comptime for a in range(R * MB):
        acc.store(a * H, SIMD[F32, H](0))
    for b in range(KB):
        comptime for i in range(R):
            var wv = qp.load[width=Q]((r + i) * K + b * Q).cast[DType.int16]()
            var d = dp.load((r + i) * KB + b).cast[F32]()
            comptime for j in range(MB):
                var a = (i * MB + j) * H
                var dots = madd(wv, xq.load[width=Q]((m0 + j) * K + b * Q)).cast[F32]()
                acc.store(a, dots.fma(SIMD[F32, H](d * xd.load((m0 + j) * KB + b)), acc.load[width=H](a)))
    comptime for i in range(R):
        comptime for j in range(MB):
            yp.store((m0 + j) * N + r + i, acc.load[width=H]((i * MB + j) * H).reduce_add())


def quantize_rows_int16(xp: UnsafePointer[Float32, _], xq: UnsafePointer[mut=True, Int16, _],
                        xd: UnsafePointer[mut=True, Float32, _], M: Int, K: Int):
    """x [M, K] -> int16 codes and one scale per block of 32 (largest
    magnitude -> 32767): 1/65534 of a block's range, far finer than the
    8-bit weights."""
    for blk in range(M * K // Q):
        var v = xp.load[width=Q](blk * Q)
        var top = abs(v).reduce_max()
        var scale = top / 32767.0 if top > 0 else Float32(0)
        var inv = 1.0 / scale if top > 0 else Float32(0)
        xd.store(blk, scale)
        xq.store(blk * Q, round(v * inv).cast[DType.int16]())


@extensibility.register("few_rows_matmul_f32")
struct FewRowsMatmulF32:
    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=F32, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var N = w.dim_size(0)
        var xp = x.unsafe_ptr()
        var wp = w.unsafe_ptr()
        var yp = y.unsafe_ptr()

        def work(t: Int) {var M, var K, var N, var xp, var wp, var yp}:
            var rows = band(N, t)
            var r = rows[0]
            while r < rows[1]:
                if r + ROWS <= rows[1]:
                    var m = 0
                    while m + 4 <= M:
                        tile_f32[ROWS, 4](xp, wp, yp, K, N, r, m)
                        m += 4
                    while m < M:
                        tile_f32[ROWS, 1](xp, wp, yp, K, N, r, m)
                        m += 1
                    r += ROWS
                else:  # the last rows of a matrix whose height is not a multiple of ROWS
                    for m in range(M):
                        tile_f32[1, 1](xp, wp, yp, K, N, r, m)
                    r += 1

        parallelize(work, TASKS)


@extensibility.register("few_rows_matmul_q8_0")
struct FewRowsMatmulQ8_0:
    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        codes: InputTensor[dtype=DType.int8, rank=2, ...],
        scales: InputTensor[dtype=DType.float16, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var N = codes.dim_size(0)
        var qp = codes.unsafe_ptr()
        var dp = scales.unsafe_ptr()
        var yp = y.unsafe_ptr()
        var xq = alloc[Int16](M * K)
        var xd = alloc[Float32](M * K // Q)
        quantize_rows_int16(x.unsafe_ptr(), xq, xd, M, K)

        def work(t: Int) {var M, var K, var N, var xq, var xd, var qp, var dp, var yp}:
            var rows = band(N, t)
            var r = rows[0]
            while r < rows[1]:
                if r + ROWS <= rows[1]:
                    var m = 0
                    while m + 4 <= M:
                        tile_q8_0[ROWS, 4](xq, xd, qp, dp, yp, K, N, r, m)
                        m += 4
                    while m < M:
                        tile_q8_0[ROWS, 1](xq, xd, qp, dp, yp, K, N, r, m)
                        m += 1
                    r += ROWS
                else:
                    for m in range(M):
                        tile_q8_0[1, 1](xq, xd, qp, dp, yp, K, N, r, m)
                    r += 1

        parallelize(work, TASKS)
        xq.free()
        xd.free()
