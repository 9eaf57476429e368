# The rest of a GPT-2 block after its attention core, as one MAX custom op
# (model/fused_block.py builds the block that calls it):
#
#   block_tail_f32   x [M, D], a [M, D] (the heads merged, before c_proj),
#                    attn c_proj (W [D, D], b), ln_2 (weight, bias),
#                    c_fc (W [H, D], b), mlp c_proj (W [D, H], b), eps [1]
#                    -> y [M, D]:
#       x1 = x + a @ Wap^T + bap                (attention's c_proj, residual)
#       y  = x1 + gelu_new(ln_2(x1) @ Wfc^T + bfc) @ Wmp^T + bmp   (the MLP, residual)
#
# Why: a MAX graph runs each op's parallel work as a section of its own, and
# a section costs ~25-40 us to start and join here where the cores reading
# the weights need ~1-5 us to wait for each other (python -m bench.sections).
# A decode step of the course's model runs 49 matmuls, each its own section.
# Here three of a layer's four are one section: the cores go through the
# three products in turn, waiting for each other in between on shared
# counters (a spinning barrier, as llama.cpp's threads do between ops), with
# the bias adds, the layer norm, gelu and the residual adds done on the way.
# The products are matmul.mojo's tiles (products()), rows dealt to the cores
# from a counter as in its ops. Measured on 12 such layers in one graph (one
# input row, a stand-in for the attention core): 13.93 ms against 14.61 for
# the same work as separate ops (8 alternated rounds, medians; README).
#
# For more than FEW_ROWS input rows (a prompt) the three products are MAX's
# own CPU matmul (linalg's, what x @ W.T runs), into scratch buffers, with
# the elementwise work and the layer norm on rows dealt to the cores between
# them: there a product takes milliseconds and a section's start is noise.

import extensibility
from extensibility import InputTensor
from extensibility import _FusedOutputTensor as FusedOutputTensor
from layout import TileTensor, row_major
from linalg.matmul import matmul
from max.algorithm import parallelize
from max.gpu.host import DeviceContext
from std.atomic import Atomic
from std.math import sqrt, tanh
from std.memory import alloc, stack_allocation
from std.sys.info import num_logical_cores

from .matmul import F32, FEW_ROWS, OUT, V, chunk_rows, deal, flush, products

comptime GELU_C = 0.7978845608028654  # sqrt(2 / pi), gelu_new's constant (step 04)


@always_inline
def gelu_new[w: Int](v: SIMD[F32, w]) -> SIMD[F32, w]:
    """GPT-2's gelu, the tanh form (step 04's gelu_new)."""
    return 0.5 * v * (1 + tanh(GELU_C * (v + 0.044715 * v * v * v)))


def layer_norm(x: UnsafePointer[Float32, _], y: UnsafePointer[mut=True, Float32, _], g: UnsafePointer[Float32, _],
               b: UnsafePointer[Float32, _], D: Int, eps: Float32):
    """y = step 03's LayerNorm of one row x[0:D]: the biased variance, eps
    inside the square root, then the scale g and shift b."""
    var dv = D - D % V
    var acc = SIMD[F32, V](0)
    for i in range(0, dv, V):
        acc += x.load[width=V](i)
    var s = acc.reduce_add()
    for i in range(dv, D):
        s += x[i]
    var mean = s / Float32(D)
    var sq = SIMD[F32, V](0)
    for i in range(0, dv, V):
        var c = x.load[width=V](i) - mean
        sq += c * c
    var q = sq.reduce_add()
    for i in range(dv, D):
        q += (x[i] - mean) * (x[i] - mean)
    var inv = 1 / sqrt(q / Float32(D) + eps)
    for i in range(0, dv, V):
        y.store(i, (x.load[width=V](i) - mean) * inv * g.load[width=V](i) + b.load[width=V](i))
    for i in range(dv, D):
        y[i] = (x[i] - mean) * inv * g[i] + b[i]


def bias_gelu(src: UnsafePointer[Float32, _], src_stride: Int, dst: UnsafePointer[mut=True, Float32, _], dst_stride: Int,
              bias: UnsafePointer[Float32, _], rows: Int, end_row: Int, start: Int, end: Int):
    """dst[m, c] = gelu_new(src[m, c] + bias[c]) for rows [rows, end_row) and
    columns [start, end): 16 lanes at a time (a scalar tanh per value cost
    more than the product at 16 rows)."""
    for m in range(rows, end_row):
        var c = start
        while c + V <= end:
            dst.store(m * dst_stride + c, gelu_new[V](src.load[width=V](m * src_stride + c) + bias.load[width=V](c)))
            c += V
        while c < end:
            dst[m * dst_stride + c] = gelu_new[1](src.load[width=1](m * src_stride + c) + bias.load[width=1](c))[0]
            c += 1


def add_into(dst: UnsafePointer[mut=True, Float32, _], dst_stride: Int, bias: UnsafePointer[Float32, _],
             res: UnsafePointer[Float32, _], res_stride: Int, rows: Int, end_row: Int, start: Int, end: Int):
    """dst[m, c] += bias[c] + res[m, c] over rows [rows, end_row), columns [start, end)."""
    for m in range(rows, end_row):
        var c = start
        while c + V <= end:
            var at = m * dst_stride + c
            dst.store(at, dst.load[width=V](at) + bias.load[width=V](c) + res.load[width=V](m * res_stride + c))
            c += V
        while c < end:
            dst[m * dst_stride + c] += bias[c] + res[m * res_stride + c]
            c += 1


@always_inline
def take(counter: UnsafePointer[mut=True, Atomic[Int64], _], items: Int) -> Int:
    """The next item of a phase from its shared counter, or -1 when none is left."""
    var i = Int(counter[].fetch_add(1))
    return i if i < items else -1


@always_inline
def wait_for(done: UnsafePointer[mut=True, Atomic[Int64], _], items: Int):
    """Spin until ``items`` items of a phase are done: the barrier between
    two phases. A core waits only on items a running core has taken, so
    this cannot deadlock if the runtime starts fewer tasks than cores."""
    while Int(done[].load()) < items:
        pass


@extensibility.register("block_tail_f32")
struct BlockTailF32:
    @staticmethod
    def execute[target: StaticString](
        y: FusedOutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        a: InputTensor[dtype=F32, rank=2, ...],
        w_ap: InputTensor[dtype=F32, rank=2, ...],
        b_ap: InputTensor[dtype=F32, rank=1, ...],
        g_ln: InputTensor[dtype=F32, rank=1, ...],
        b_ln: InputTensor[dtype=F32, rank=1, ...],
        w_fc: InputTensor[dtype=F32, rank=2, ...],
        b_fc: InputTensor[dtype=F32, rank=1, ...],
        w_mp: InputTensor[dtype=F32, rank=2, ...],
        b_mp: InputTensor[dtype=F32, rank=1, ...],
        eps_in: InputTensor[dtype=F32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var M = x.dim_size(0)
        var D = x.dim_size(1)
        var H = w_fc.dim_size(0)
        if M == 0:
            return
        var xp = x.unsafe_ptr()
        var ap = a.unsafe_ptr()
        var wap = w_ap.unsafe_ptr()
        var bap = b_ap.unsafe_ptr()
        var gln = g_ln.unsafe_ptr()
        var bln = b_ln.unsafe_ptr()
        var wfc = w_fc.unsafe_ptr()
        var bfc = b_fc.unsafe_ptr()
        var wmp = w_mp.unsafe_ptr()
        var bmp = b_mp.unsafe_ptr()
        var eps = eps_in.unsafe_ptr()[0]
        var x1 = alloc[Float32](M * D)  # x after the attention's residual
        var n = alloc[Float32](M * D)  # ln_2(x1); for a prompt, then the MLP's output
        var h = alloc[Float32](M * H)  # gelu(c_fc)

        if M > FEW_ROWS:  # a prompt: MAX's matmul for each product, the rest on rows dealt to the cores
            matmul[transpose_b=True](TileTensor(x1, row_major((M, D))), TileTensor(ap, row_major((M, D))),
                                     TileTensor(wap, row_major((D, D))), None)

            def residual_norm(start: Int, end: Int) {var D, var x1, var n, var bap, var xp, var gln, var bln, var eps}:
                add_into(x1, D, bap, xp, D, start, end, 0, D)
                for m in range(start, end):
                    layer_norm(x1 + m * D, n + m * D, gln, bln, D, eps)

            deal(residual_norm, M, 4)
            matmul[transpose_b=True](TileTensor(h, row_major((M, H))), TileTensor(n, row_major((M, D))),
                                     TileTensor(wfc, row_major((H, D))), None)

            def activate(start: Int, end: Int) {var H, var h, var bfc}:
                bias_gelu(h, H, h, H, bfc, start, end, 0, H)

            deal(activate, M, 4)
            matmul[transpose_b=True](TileTensor(n, row_major((M, D))), TileTensor(h, row_major((M, H))),
                                     TileTensor(wmp, row_major((D, H))), None)

            def out(start: Int, end: Int) {var D, var n, var bmp, var x1, var y}:
                add_into(n, D, bmp, x1, D, start, end, 0, D)
                flush(y, n, D, start, end, 0, D)

            deal(out, M, 4)
        else:  # few rows: one parallel section, the cores waiting for each other between phases
            var counters = alloc[Atomic[Int64]](8)  # (taken, done) per phase
            for i in range(8):
                counters[i] = Atomic[Int64](0)
            var chunk = chunk_rows(M)
            var d_chunks = (D + chunk - 1) // chunk
            var h_chunks = (H + chunk - 1) // chunk

            def work(t: Int) {var M, var D, var H, var xp, var ap, var wap, var bap, var gln, var bln, var wfc, var bfc,
                              var wmp, var bmp, var eps, var x1, var n, var h, var counters, var chunk, var d_chunks,
                              var h_chunks, var y}:
                var buf = stack_allocation[FEW_ROWS * OUT, Float32]()
                while True:  # 1. x1 = x + a @ Wap^T + bap
                    var c = take(counters, d_chunks)
                    if c < 0:
                        break
                    var start = c * chunk
                    var end = min(start + chunk, D)
                    var o = buf - start  # column c of row m at o + m * OUT + c
                    products(ap, wap, o, M, D, D, start, end)
                    add_into(o, OUT, bap, xp, D, 0, M, start, end)
                    for m in range(M):
                        for i in range(start, end):
                            x1[m * D + i] = o[m * OUT + i]
                    _ = counters[1].fetch_add(1)
                wait_for(counters + 1, d_chunks)
                while True:  # 2. n = ln_2(x1), a row at a time
                    var m = take(counters + 2, M)
                    if m < 0:
                        break
                    layer_norm(x1 + m * D, n + m * D, gln, bln, D, eps)
                    _ = counters[3].fetch_add(1)
                wait_for(counters + 3, M)
                while True:  # 3. h = gelu(n @ Wfc^T + bfc)
                    var c = take(counters + 4, h_chunks)
                    if c < 0:
                        break
                    var start = c * chunk
                    var end = min(start + chunk, H)
                    var o = buf - start
                    products(n, wfc, o, M, D, H, start, end)
                    bias_gelu(o, OUT, h, H, bfc, 0, M, start, end)
                    _ = counters[5].fetch_add(1)
                wait_for(counters + 5, h_chunks)
                while True:  # 4. y = x1 + h @ Wmp^T + bmp, through y's fused store
                    var c = take(counters + 6, d_chunks)
                    if c < 0:
                        break
                    var start = c * chunk
                    var end = min(start + chunk, D)
                    var o = buf - start
                    products(h, wmp, o, M, H, D, start, end)
                    add_into(o, OUT, bmp, x1, D, 0, M, start, end)
                    flush(y, o, OUT, 0, M, start, end)

            parallelize(work, num_logical_cores())
            counters.free()
        x1.free()
        n.free()
        h.free()
