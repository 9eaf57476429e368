# An experiment, not used by the app: model/kernels' Q8_0 GEMV for one
# input row on an interleaved weight layout. `python -m bench.q8_0_layout`
# compiles this folder and times it against model/kernels' own op.
#
# Why: model/kernels reads codes [N, K] 8 rows at a time, i.e. 8 pieces of
# 64 bytes, K bytes apart, per step. Here each 8-row tile is stored as one
# contiguous stream: codes [ceil(N / 8), K * 8] int8 (per step of 64
# weights: row 0's 64 codes, row 1's, ... row 7's), scales
# [ceil(N / 8), K / 64 * 16] float16 (per step the 8 rows' two block scales,
# one 32-byte load). Same arithmetic as model/kernels (its dot4 and
# prepare_inputs are imported), so the results are the same bits.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.algorithm import parallelize
from max.gpu.host import DeviceContext
from std.memory import alloc, bitcast, stack_allocation
from kernels.matmul import F32, P, TASKS, dot4, prepare_inputs


comptime R = 8  # weight rows per tile (model/kernels' ROWS for one input row)


@always_inline
def tile_interleaved(
    xq: UnsafePointer[Int8, _], xs: UnsafePointer[Float32, _], xc: UnsafePointer[Int32, _],
    qp: UnsafePointer[Int8, _], dp: UnsafePointer[Float16, _], yp: UnsafePointer[mut=True, Float32, _],
    K: Int, N: Int, t: Int,
):
    """y[t*R : t*R+R] for one input row: model/kernels' tile_q8_0[R, 1],
    reading tile t's codes and scales as one stream."""
    var steps = K // P
    var acc = stack_allocation[R * 16, Float32]()
    comptime for i in range(R):
        acc.store(i * 16, SIMD[F32, 16](0))
    for p in range(steps):
        var d = dp.load[width=2 * R](t * steps * 2 * R + p * 2 * R).cast[F32]()
        var x = xq.load[width=P](p * P)
        var correction = xc.load[width=16](p * 16)
        var xd = xs.load[width=16](p * 16)
        comptime for i in range(R):
            var w = bitcast[DType.uint8, P](qp.load[width=P]((t * steps + p) * R * P + i * P)) ^ 128
            var dw = SIMD[F32, 8](d[2 * i]).join(SIMD[F32, 8](d[2 * i + 1]))
            acc.store(i * 16, dot4(correction, w, x).cast[F32]().fma(dw * xd, acc.load[width=16](i * 16)))
    comptime for i in range(R):
        if t * R + i < N:
            yp.store(t * R + i, acc.load[width=16](i * 16).reduce_add())


@extensibility.register("few_rows_matmul_q8_0_interleaved")
struct FewRowsMatmulQ8_0Interleaved:
    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        codes: InputTensor[dtype=DType.int8, rank=2, ...],
        scales: InputTensor[dtype=DType.float16, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var K = x.dim_size(1)
        var N = y.dim_size(1)
        var tiles = codes.dim_size(0)
        var qp = codes.unsafe_ptr()
        var dp = scales.unsafe_ptr()
        var yp = y.unsafe_ptr()
        var xq = alloc[Int8](K)
        var xs = alloc[Float32](K // P * 16)
        var xc = alloc[Int32](K // P * 16)
        prepare_inputs(x.unsafe_ptr(), xq, xs, xc, 1, K)  # x: one row (decode at batch 1)

        def work(task: Int) {var K, var N, var tiles, var xq, var xs, var xc, var qp, var dp, var yp}:
            var per = (tiles + TASKS - 1) // TASKS
            for t in range(task * per, min(task * per + per, tiles)):
                tile_interleaved(xq, xs, xc, qp, dp, yp, K, N, t)

        parallelize(work, TASKS)
        xq.free()
        xs.free()
        xc.free()
