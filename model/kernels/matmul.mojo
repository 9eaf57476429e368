# Matmuls for few rows (decode), as MAX custom ops: y = x @ W^T.
#
# Why: decoding one token reads every weight once, so its speed is the rate
# at which the weights stream from memory. MAX 26.7's CPU matmul for a
# [1, K] x [K, N] product tiles and packs W at run time, far below that rate.
# These kernels read W once, as it is stored ([N, K] for fp32, 8-row tiles
# for Q8_0: below), each core taking chunks of rows in turn, 8 weight rows x
# 1 input row per tile (decode); for a few input rows, tiles of several
# weight rows x several input rows (sized per kernel path: isa.mojo), so
# every weight vector loaded is used for every input row. For more than FEW_ROWS
# input rows (a prompt) the f32 op hands the product to MAX's own CPU matmul
# (MatmulCPU, the kernel `x @ W.T` compiles to), from inside the op: the
# graph then needs no F.cond to choose, and both paths write through the
# op's fused output, so MAX fuses the ops that follow (the bias add, gelu)
# into this op instead of running each as a kernel of its own. The Q8_0 op
# runs its integer-dot tiles for any number of rows where the CPU has an
# 8-bit dot product instruction (AVX-512 VNNI: on a prompt as fast as
# dequantizing for MAX's matmul); elsewhere a prompt's product is MAX's
# float32 matmul on weights dequantized a band at a time, inside the op,
# above a row count per path (q8_0_dequantize_above). `python -m
# bench.kernels` measures both.
#
#   few_rows_matmul_f32   x [M, K] f32, W [N, K] f32             -> y [M, N] f32
#   few_rows_matmul_q8_0  x [M, K] f32, W codes [T, K * 8] int8,
#                         W scales [T, K / 4] f16 bits (uint16)  -> y [M, N] f32
#                         (T = ceil(N / 8) tiles, interleaved: below)
#
# Q8_0 is GGUF's 8-bit format: every 32 consecutive weights of a row share
# one float16 scale d, a weight is d * code. llama.cpp stores each block as
# d then 32 codes; here codes and scales are two arrays (same numbers,
# aligned vector loads), and each tile of ROWS = 8 weight rows is one
# contiguous stream, block by block: per block of 32 weights, 8 steps of 4
# weights, each step the 8 rows' 4 codes (32 bytes: row i's at 4i), and in
# the scales array the 8 rows' scales (one 16-byte load). The last tile is
# padded with zero rows. Why: one stream per tile reads much faster than 8
# rows K bytes apart, and with each row's 4 codes in its own int32 lane, one
# 8-bit dot product instruction against the input's 4 codes broadcast to
# every lane advances all 8 rows at once, so a block ends with the 8 rows'
# sums in one vector: one conversion and one multiply-add per block for the
# 8 rows (model/quantize.py's interleave_q8_0 makes the layout).
# The scales arrive as uint16, their float16 bits: MAX 26.7 refuses a float16
# tensor in a graph compiled for an Arm CPU, not float16 inside a kernel.
# The measurements behind this file's choices: docs/decisions/0003 and
# docs/cpu.md; `python -m bench.kernels` re-runs them.

import extensibility
from extensibility import InputTensor
from extensibility import _FusedOutputTensor as FusedOutputTensor
from builtin_kernels.linalg import MatmulCPU
from layout import TileTensor, row_major
from linalg.matmul import matmul
from max.algorithm import parallelize, sync_parallelize
from std.atomic import Atomic
from std.sys.info import num_logical_cores
from max.gpu.host import DeviceContext
from max.gpu.host.device_context import DeviceContextBase
from std.sys.info import CompilationTarget
from std.memory import alloc, bitcast, stack_allocation
from std.sys.intrinsics import PrefetchOptions, prefetch
from std.utils.index import IndexList

from .isa import AVX2, AVX512_VNNI, has_vnni, registers, resolved, signed_dot4, vector_bytes

comptime F32 = DType.float32
comptime Q = 32  # weights per Q8_0 block
# Weight rows per f32 tile for one input row, and per Q8_0 tile in memory:
# 8 independent streams in flight per step (4 was slower, 12 and 16 no better).
comptime ROWS = 8
comptime TASKS = 8  # bands of rows for a static split (flush_in_parallel: a prompt's scratch into y)
# The ops deal their rows to the cores a chunk at a time (deal()): each core
# takes the chunks of its own contiguous share first, so its weights stream
# from one place, then what is left of the others', so a core that wakes late
# or reads slower takes fewer, where with fixed bands every matmul waited for
# its slowest band. A chunk is kept at ~25-100 KB of weights so a counter's
# ~0.1 us is noise.
comptime CHUNK = 32  # f32 one-row path: rows a core takes at a time
comptime WIDE_CHUNK = 24  # f32 few-rows path: rows a core takes at a time (8 groups of WIDE_ROWS)
comptime OUT = 32  # columns of a chunk's output buffer: max(CHUNK, WIDE_CHUNK)
comptime TILE_CHUNK = 8  # Q8_0 op: 8-row tiles a core takes at a time
comptime MAX_WORKERS = 256  # cores an op deals its work to, at most
comptime LINE = 8  # Int64 counters a cache line holds: each share's counter has a line of its own


@always_inline
def deal[Body: def(Int, Int) register_passable -> None](body: Body, items: Int, chunk: Int, ctx: DeviceContext):
    """body(start, end) over [0, items) in chunks of ``chunk``, one task per
    core, started as MAX's own kernels start theirs (sync_parallelize with
    the op's device context: a cheaper boundary between chained ops than
    parallelize without it). Each task takes the next chunk of its own
    contiguous share from that share's counter, then of the other shares."""
    var chunks = (items + chunk - 1) // chunk
    var workers = min(chunks, num_logical_cores(), MAX_WORKERS)
    var run = UnsafePointer(to=body)  # captured by address: a closure is not copyable
    # Chunks taken of each worker's share, a cache line apart: a core takes
    # from its own share's counter without taking the line from the others.
    var taken = stack_allocation[MAX_WORKERS * LINE, Atomic[Int64], alignment=64]()
    for w in range(workers):
        taken[w * LINE] = Atomic[Int64](0)

    def work(t: Int) {var run, var chunks, var chunk, var items, var workers, var taken}:
        var per = chunks // workers
        var extra = chunks % workers
        for k in range(workers):  # its own share first, then what is left of the others'
            var w = (t + k) % workers
            var first = w * per + min(w, extra)
            var count = per + (1 if w < extra else 0)
            while True:
                var c = Int(taken[w * LINE].fetch_add(1))
                if c >= count:
                    break
                run[]((first + c) * chunk, min((first + c) * chunk + chunk, items))

    sync_parallelize(work, workers, Optional(rebind[DeviceContextBase[CompilationTarget()]](ctx)))


# More than one input row (f32): each group of WIDE_ROWS weight rows is
# multiplied into up to wide_inputs() input rows at once, all the input rows
# before the next group, so the weights stream from memory in one pass; each
# group's first tile prefetches the next group's rows, so 6 weight rows
# stream at once instead of 3.
comptime WIDE_ROWS = 3


def wide_inputs(isa: Int) -> Int:
    """Input rows per few-rows f32 tile: 3 x 8 accumulators + 3 weight
    vectors + 1 input fit AVX-512's 32 registers; 3 x 4 + 4 fit 16 (AVX2)."""
    return 8 if registers(isa) >= 32 else 4


# Input rows up to which the f32 op runs its own tiles (faster than MAX's
# matmul there, bias adds and gelus fused); above, MAX's matmul.
comptime FEW_ROWS = 16


@always_inline
def tile_f32[V: Int, R: Int, MB: Int](
    xp: UnsafePointer[Float32, _], wp: UnsafePointer[Float32, _], o: UnsafePointer[mut=True, Float32, _],
    K: Int, r: Int, m0: Int, pf: Int = -1,
):
    """y[m0:m0+MB, r:r+R] from W rows r..r+R, V float32 lanes a vector
    (the path's register width): each W vector is loaded once
    and multiplied into MB accumulators (kept in registers once unrolled).
    The results go to o (row m at o + m * OUT, column r at o + r): the
    chunk's buffer, which flush() hands to y's fused store.
    pf >= 0: also prefetch W rows pf..pf+R (the next tile's) as it goes."""
    var acc = stack_allocation[R * MB * V, Float32]()
    var wv = stack_allocation[R * V, Float32]()
    comptime for a in range(R * MB):
        acc.store(a * V, SIMD[F32, V](0))
    var kv = K - K % V
    for k in range(0, kv, V):
        if pf >= 0:
            comptime for i in range(R):
                prefetch[PrefetchOptions().for_read().high_locality()](wp + (pf + i) * K + k)
        # The R weight vectors first, then each input vector once against all
        # of them: R + 1 + R * MB registers. Loading one weight vector at a
        # time against every input let the compiler hold all MB input vectors
        # and spill accumulators.
        comptime for i in range(R):
            wv.store(i * V, wp.load[width=V]((r + i) * K + k))
        comptime for j in range(MB):
            var xv = xp.load[width=V]((m0 + j) * K + k)
            comptime for i in range(R):
                var a = (i * MB + j) * V
                acc.store(a, wv.load[width=V](i * V).fma(xv, acc.load[width=V](a)))
    comptime for i in range(R):
        comptime for j in range(MB):
            var s = acc.load[width=V]((i * MB + j) * V).reduce_add()
            for k in range(kv, K):  # a width that is not a multiple of V
                s += wp.load((r + i) * K + k) * xp.load((m0 + j) * K + k)
            o.store((m0 + j) * OUT + r + i, s)


@always_inline
def flush(y: FusedOutputTensor[dtype=F32, rank=2, ...], o: UnsafePointer[Float32, _], stride: Int,
          rows: Int, end_row: Int, start: Int, end: Int):
    """y[rows:end_row, start:end] from a buffer o that holds y[m, c] at
    o + m * stride + c (a chunk's, as tile_f32 wrote it; q4_0.mojo's scratch
    for a prompt), through y's fused store, 16 or 8 columns at a time: so the
    epilogue MAX fused in (the bias add, c_fc's gelu) runs on vectors, not
    one value at a time."""
    for m in range(rows, end_row):
        var c = start
        while c + 16 <= end:
            y._fused_store[16, 2](IndexList[2](m, c), o.load[width=16](m * stride + c))
            c += 16
        while c + 8 <= end:
            y._fused_store[8, 2](IndexList[2](m, c), o.load[width=8](m * stride + c))
            c += 8
        while c < end:
            y._fused_store[1, 2](IndexList[2](m, c), o.load[width=1](m * stride + c))
            c += 1


def flush_in_parallel(y: FusedOutputTensor[dtype=F32, rank=2, ...], o: UnsafePointer[Float32, _], stride: Int,
                      M: Int, start: Int, end: Int):
    """flush() of rows 0..M-1, columns start..end-1, the rows split into TASKS
    bands run in parallel: a prompt's scratch, from MAX's matmul called
    inside an op, through the op's fused store."""

    def band(t: Int) {var M, var o, var stride, var start, var end, var y}:
        var per = (M + TASKS - 1) // TASKS
        flush(y, o, stride, t * per, min(t * per + per, M), start, end)

    parallelize(band, TASKS)


# Blocks ahead that a Q8_0 tile prefetches its own stream (0: none): a tile
# is one contiguous stream and the hardware prefetcher alone kept too few of
# its lines in flight. A prefetch past the array's end (the last tiles) is
# harmless: a prefetch never faults.
comptime QPF = 4
comptime TILE_BLOCK = ROWS * Q  # bytes of codes per block of a tile


def q8_0_code_bytes(isa: Int) -> Int:
    """Bytes of codes per vector in the Q8_0 tile: 64 (two steps of the
    8 rows) on AVX512_VNNI, else 32 (one step; the portable path's SIMD of
    32 is split into the target's vectors)."""
    return 64 if isa == AVX512_VNNI else 32


def q8_0_dequantize_above(isa: Int) -> Int:
    """Input rows above which the Q8_0 op hands the product to MAX's float32
    matmul on weights dequantized a band at a time, rather than run its
    integer-dot tiles. With VNNI's vpdpbusd the tiles are as fast at any row
    count: never. Without (AVX2: vpsignb, vpabsb, vpmaddubsw, vpmaddwd per 32
    bytes; the portable path widens to int32) a prompt's product is
    compute-bound in the tiles and MAX's float32 matmul is faster once the
    rows repay the dequantizing, which costs the same at any row count. The
    activations then stay float32 (not rounded to Q8_0 as llama.cpp's are)."""
    if has_vnni(isa):
        return Int.MAX
    return Q8_0_AVX2_TILES_UP_TO if isa == AVX2 else FEW_ROWS


# AVX2: the rows up to which the Q8_0 tiles beat dequantizing for MAX's matmul
# (measured with bench.kernels --step --rows; docs/decisions/0003).
comptime Q8_0_AVX2_TILES_UP_TO = 32


# Weight rows a prompt's Q8_0 product dequantizes at a time (a multiple of
# ROWS): 3 MB of float32 per band at K = 768, reused by every input row.
comptime DEQUANT_BAND = 1024


def q8_0_tile_inputs(isa: Int) -> Int:
    """Input rows per Q8_0 tile call when there are several: each code
    vector loaded is used for every one of them, an int32 and a float32
    accumulator per input row in registers (AVX-512's 32 hold 4, AVX2's 16
    hold 2 beside the vpsignb form's temporaries)."""
    return 4 if registers(isa) >= 32 else 2


@always_inline
def step_inputs[SV: Int](xq: UnsafePointer[Int8, _], at: Int) -> SIMD[DType.int8, SV]:
    """The input's codes at..at+SV/8-1 as a code vector's partner: each
    step's 4 codes broadcast to its 8 lanes (the 8 rows)."""
    var x4 = (xq + at).bitcast[Int32]()
    comptime if SV == 64:
        return bitcast[DType.int8, SV](SIMD[DType.int32, 8](x4[0]).join(SIMD[DType.int32, 8](x4[1])))
    else:
        return bitcast[DType.int8, SV](SIMD[DType.int32, SV // 4](x4[0]))


@always_inline
def tile_q8_0[isa: Int, MB: Int](
    xq: UnsafePointer[Int8, _], xs: UnsafePointer[Float32, _], xc: UnsafePointer[Int32, _],
    qp: UnsafePointer[Int8, _], dp: UnsafePointer[Float16, _], y: FusedOutputTensor[dtype=F32, rank=2, ...],
    K: Int, N: Int, t: Int, m0: Int,
):
    """y[m0:m0+MB, t*ROWS .. +ROWS] from tile t of the interleaved layout
    (see the top of this file), against Q8_0 inputs (as llama.cpp does):
    per block, each code vector (one or two steps of the 8 rows) is an
    integer dot product with the input's 4 codes of its step broadcast,
    lane i row i's; the block's int32 sums (one per row) are then scaled by
    the rows' d times the input's d into float32 accumulators. On the VNNI
    paths the codes are made unsigned (+128) for vpdpbusd, and xc, -128
    times the input's codes summed per block, takes that back out."""
    comptime SV = q8_0_code_bytes(isa)
    comptime L = SV // 4  # int32 lanes of a code vector
    var blocks = K // Q
    var facc = stack_allocation[MB * ROWS, Float32]()
    var iacc = stack_allocation[MB * L, Int32]()
    comptime for j in range(MB):
        facc.store(j * ROWS, SIMD[F32, ROWS](0))
    for b in range(blocks):
        var at = t * blocks + b
        var codes = qp + at * TILE_BLOCK
        comptime if QPF > 0:
            comptime for line in range(0, TILE_BLOCK, 64):
                prefetch[PrefetchOptions().for_read().high_locality()](codes + QPF * TILE_BLOCK + line)
        comptime for j in range(MB):
            iacc.store(j * L, SIMD[DType.int32, L](0))
        comptime for v in range(TILE_BLOCK // SV):
            var w = codes.load[width=SV](v * SV)
            comptime for j in range(MB):
                var x = step_inputs[SV](xq, (m0 + j) * K + b * Q + v * (SV // ROWS))
                iacc.store(j * L, signed_dot4[isa, L](iacc.load[width=L](j * L), rebind[SIMD[DType.int8, 4 * L]](w),
                                                      rebind[SIMD[DType.int8, 4 * L]](x)))
        var d = dp.load[width=ROWS](at * ROWS).cast[F32]()
        comptime for j in range(MB):
            var sums: SIMD[DType.int32, ROWS]
            comptime if L == 2 * ROWS:
                var s = iacc.load[width=L](j * L)
                sums = rebind[SIMD[DType.int32, ROWS]](s.slice[ROWS, offset=0]() + s.slice[ROWS, offset=ROWS]())
            else:
                sums = rebind[SIMD[DType.int32, ROWS]](iacc.load[width=L](j * L))
            var block = (m0 + j) * blocks + b
            comptime if has_vnni(isa):
                sums += xc[block]
            facc.store(j * ROWS, sums.cast[F32]().fma(d * xs[block], facc.load[width=ROWS](j * ROWS)))
    # Each input row's 8 sums as one vector through y's fused store, so the
    # epilogue MAX fused in runs on vectors (see flush()); the last tile's
    # padding rows are not outputs.
    var row = t * ROWS
    comptime for j in range(MB):
        var v = facc.load[width=ROWS](j * ROWS)
        if row + ROWS <= N:
            y._fused_store[ROWS, 2](IndexList[2](m0 + j, row), v)
        else:
            for i in range(max(N - row, 0)):
                y._fused_store[1, 2](IndexList[2](m0 + j, row + i), SIMD[F32, 1](v[i]))


@always_inline
def q8_0_block(v: SIMD[F32, Q]) -> Tuple[SIMD[DType.int8, Q], Float32]:
    """One block of 32 inputs as Q8_0, llama.cpp's rounding: the codes
    round(v / d) and d = max|v| / 127."""
    var top = abs(v).reduce_max()
    var inv = 127.0 / top if top > 0 else Float32(0)
    return (round(v * inv).cast[DType.int8](), top / 127.0)


def prepare_inputs(xp: UnsafePointer[Float32, _], xq: UnsafePointer[mut=True, Int8, _],
                   xs: UnsafePointer[mut=True, Float32, _], xc: UnsafePointer[mut=True, Int32, _], M: Int, K: Int):
    """x [M, K] float32 -> Q8_0 codes (xq [M, K] int8, d = max|x| / 127 per
    block of 32) and per block: xs its d, xc -128 times its codes summed
    (the correction for the weights' +128 on the VNNI paths)."""
    for blk in range(M * K // Q):
        var block = q8_0_block(xp.load[width=Q](blk * Q))
        var codes = block[0]
        xq.store(blk * Q, codes)
        xs[blk] = block[1]
        xc[blk] = Int32(-128) * codes.cast[DType.int32]().reduce_add()


def dequantize_tiles(qp: UnsafePointer[Int8, _], dp: UnsafePointer[Float16, _], wf: UnsafePointer[mut=True, Float32, _],
                     K: Int, first: Int, end: Int, start: Int):
    """Tiles first..end-1 of the interleaved layout as float32 rows of K
    (code * scale), tile t's row i at wf + (t * ROWS + i - start) * K."""
    var blocks = K // Q
    for t in range(first, end):
        for b in range(blocks):
            var at = t * blocks + b
            var d = dp.load[width=ROWS](at * ROWS).cast[F32]()
            var steps = (qp + at * TILE_BLOCK).bitcast[Int32]()  # step s, row i: steps[s * ROWS + i]
            comptime for i in range(ROWS):
                var row = SIMD[DType.int32, Q // 4]()
                comptime for s in range(Q // 4):
                    row[s] = steps[s * ROWS + i]
                wf.store((t * ROWS + i - start) * K + b * Q, bitcast[DType.int8, Q](row).cast[F32]() * d[i])


def dequantized_matmul(y: FusedOutputTensor[dtype=F32, rank=2, ...], x: InputTensor[dtype=F32, rank=2, ...],
                       qp: UnsafePointer[Int8, _], dp: UnsafePointer[Float16, _],
                       M: Int, K: Int, N: Int, tiles: Int, ctx: DeviceContext) raises:
    """y = x @ W^T for a prompt: per band of DEQUANT_BAND weight rows, the
    band dequantized to float32 (its tiles dealt to the cores), MAX's
    float32 matmul into a scratch, then through y's fused store."""
    comptime assert DEQUANT_BAND % ROWS == 0, "a band is whole tiles"
    var wf = alloc[Float32](min(DEQUANT_BAND, tiles * ROWS) * K)
    var c = alloc[Float32](M * min(DEQUANT_BAND, N))
    var a = x.to_tile_tensor[DType.int64]()
    for start in range(0, N, DEQUANT_BAND):
        var end = min(start + DEQUANT_BAND, N)
        var rows = end - start
        var first_tile = start // ROWS
        var end_tile = (end + ROWS - 1) // ROWS

        def unpack(s: Int, e: Int) {var qp, var dp, var wf, var K, var start, var first_tile}:
            dequantize_tiles(qp, dp, wf, K, first_tile + s, first_tile + e, start)

        deal(unpack, end_tile - first_tile, 1, ctx)
        matmul[transpose_b=True](TileTensor(c, row_major((M, rows))), a, TileTensor(wf, row_major((rows, K))), ctx)
        flush_in_parallel(y, c - start, rows, M, start, end)  # column n of row m at c + m * rows + n - start
    wf.free()
    c.free()


@extensibility.register("few_rows_matmul_f32")
struct FewRowsMatmulF32:
    @staticmethod
    def execute[target: StaticString, isa: Int, isa1: Int](
        y: FusedOutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        w: InputTensor[dtype=F32, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var M = x.dim_size(0)
        if M > FEW_ROWS:  # a prompt: MAX's tiled matmul, the fused epilogue applied by it
            MatmulCPU.execute[transpose_b=True, packed_b=False, has_epilogue_fusion=True, target=target,
                              _trace_name="few_rows_matmul_f32"](y, x, w, ctx)
            return
        comptime assert OUT >= CHUNK and OUT >= WIDE_CHUNK, "a chunk's columns must fit its output buffer"
        comptime I = resolved(isa)
        comptime V = vector_bytes(I) // 4  # float32 lanes of one register
        comptime V1 = vector_bytes(resolved(isa1)) // 4  # the same for one input row
        comptime WIDE = wide_inputs(I)
        var K = x.dim_size(1)
        var N = w.dim_size(0)
        var xp = x.unsafe_ptr()
        var wp = w.unsafe_ptr()

        # Rows are dealt to the cores a chunk at a time from a shared counter,
        # so a core that is late to start, or reads slower, takes fewer.
        def rows(start: Int, end: Int) {var M, var K, var N, var xp, var wp, var y}:
            var buf = stack_allocation[FEW_ROWS * OUT, Float32]()
            var o = buf - start  # column c of row m at o + m * OUT + c
            var r = start
            if M == 1:  # decode: 8 weight rows at a time, 8 streams in flight
                while r + ROWS <= end:
                    tile_f32[V1, ROWS, 1](xp, wp, o, K, r, 0)
                    r += ROWS
            else:  # a few input rows: every one against WIDE_ROWS weight rows, while they are in L1
                while r + WIDE_ROWS <= end:
                    var m = 0
                    # The group's first tile also prefetches the next group's
                    # rows: 6 weight rows in flight rather than 3.
                    var pf = r + WIDE_ROWS if r + 2 * WIDE_ROWS <= N else -1
                    while m + WIDE <= M:
                        tile_f32[V, WIDE_ROWS, WIDE](xp, wp, o, K, r, m, pf)
                        m += WIDE
                        pf = -1
                    if WIDE > 4 and m + 4 <= M:
                        tile_f32[V, WIDE_ROWS, 4](xp, wp, o, K, r, m, pf)
                        m += 4
                        pf = -1
                    if m + 2 <= M:
                        tile_f32[V, WIDE_ROWS, 2](xp, wp, o, K, r, m, pf)
                        m += 2
                        pf = -1
                    if m < M:
                        tile_f32[V, WIDE_ROWS, 1](xp, wp, o, K, r, m, pf)
                    r += WIDE_ROWS
            while r < end:  # the last rows, fewer than a tile
                for m in range(M):
                    tile_f32[V, 1, 1](xp, wp, o, K, r, m)
                r += 1
            flush(y, o, OUT, 0, M, start, end)

        deal(rows, N, CHUNK if M == 1 else WIDE_CHUNK, ctx)


@extensibility.register("few_rows_matmul_q8_0")
struct FewRowsMatmulQ8_0:
    @staticmethod
    def execute[target: StaticString, isa: Int, isa1: Int](
        y: FusedOutputTensor[dtype=F32, rank=2, ...],
        x: InputTensor[dtype=F32, rank=2, ...],
        codes: InputTensor[dtype=DType.int8, rank=2, ...],
        scales: InputTensor[dtype=DType.uint16, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var N = y.dim_size(1)
        var tiles = codes.dim_size(0)
        var qp = codes.unsafe_ptr()
        var dp = scales.unsafe_ptr().bitcast[Float16]()
        comptime I = resolved(isa)
        comptime I1 = resolved(isa1)  # the path for one input row
        comptime ABOVE = q8_0_dequantize_above(I)
        comptime if ABOVE < Int.MAX:  # not compiled at all on the VNNI path
            if M > ABOVE:
                dequantized_matmul(y, x, qp, dp, M, K, N, tiles, ctx)
                return
        var xq = alloc[Int8](M * K)
        var xs = alloc[Float32](M * K // Q)
        var xc = alloc[Int32](M * K // Q)
        prepare_inputs(x.unsafe_ptr(), xq, xs, xc, M, K)

        comptime MB = q8_0_tile_inputs(I)  # input rows per call, several

        def work(start: Int, end: Int) {var M, var K, var N, var xq, var xs, var xc, var qp, var dp, var y}:
            for t in range(start, end):
                var m = 0
                while m + MB <= M:
                    tile_q8_0[I, MB](xq, xs, xc, qp, dp, y, K, N, t, m)
                    m += MB
                while m < M:
                    tile_q8_0[I1, 1](xq, xs, xc, qp, dp, y, K, N, t, m)
                    m += 1

        deal(work, tiles, TILE_CHUNK, ctx)  # tiles dealt a chunk at a time, as in the f32 op
        xq.free()
        xs.free()
        xc.free()
