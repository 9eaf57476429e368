# Attention over the app's in-place KV cache, as one MAX custom op.
#
# Why: step 07's attention, on model/kv_cache.py's buffers, is a chain of
# graph ops per layer: split the heads (a transpose), store the new keys and
# values, read the cached ones back as tensors, q @ k^T, the causal mask,
# softmax, @ v, merge the heads (a transpose). At 896+ positions of context a
# decode step of GPT-2 124M cost ~10-13 ms more than at 16 (`python -m
# bench.profile_decode --context 896`), where llama.cpp's costs ~2 ms more:
# the kernel time went to copies and fresh allocations (perf: the kernel's
# page zeroing, `clear_page_erms`, ~10% of all samples). This op reads the
# cache where it lies and writes nothing but the new rows and the output.
#
#   cached_attention  y [B, S, E] f32          (the heads merged, as c_proj takes it)
#                     qkv [B, S, 3 * E] f32    (c_attn's output: q, k, v, heads in order)
#                     keys, values [B, H, C, D] f32, mutable (the cache buffers)
#                     start [1] int64          (cached positions before this call)
#
# It stores this call's keys and values at rows [start, start + S) of every
# head, then for query s (position start + s) computes softmax(q k^T / sqrt(D))
# over keys 0 .. start + s (the causal mask) times v: step 07's arithmetic,
# in another order (tests/test_kv_cache.py compares logits and tokens).

import extensibility
from extensibility import InputTensor, OutputTensor, _MutableInputTensor as MutableInputTensor
from max.algorithm import parallelize
from max.gpu.host import DeviceContext
from std.math import exp, sqrt
from std.memory import alloc

comptime F32 = DType.float32
comptime V = 16  # float32 lanes of one AVX-512 register
comptime QUERIES = 8  # queries per task: a long prompt's rows are spread over the cores too


@always_inline
def dot(a: UnsafePointer[Float32, _], b: UnsafePointer[Float32, _], D: Int) -> Float32:
    var acc = SIMD[F32, V](0)
    var dv = D - D % V
    for d in range(0, dv, V):
        acc = a.load[width=V](d).fma(b.load[width=V](d), acc)
    var s = acc.reduce_add()
    for d in range(dv, D):
        s += a.load(d) * b.load(d)
    return s


def attend(q: UnsafePointer[Float32, _], kb: UnsafePointer[Float32, _], vb: UnsafePointer[Float32, _],
           o: UnsafePointer[mut=True, Float32, _], p: UnsafePointer[mut=True, Float32, _], L: Int, D: Int):
    """o[0:D] = softmax(q . k_j / sqrt(D), j < L) weighted sum of v_j: the
    scores kept in p[0:L]."""
    var scale = 1.0 / sqrt(Float32(D))
    var top = Float32.MIN
    for j in range(L):
        var s = dot(q, kb + j * D, D) * scale
        p.store(j, s)
        top = max(top, s)
    var total = Float32(0)
    var lv = L - L % V
    for j in range(0, lv, V):
        var e = exp(p.load[width=V](j) - top)
        p.store(j, e)
        total += e.reduce_add()
    for j in range(lv, L):
        var e = exp(p.load(j) - top)
        p.store(j, e)
        total += e
    var dv = D - D % V
    for d in range(0, dv, V):
        o.store(d, SIMD[F32, V](0))
    for d in range(dv, D):
        o.store(d, 0)
    for j in range(L):
        var w = p.load(j)
        for d in range(0, dv, V):
            o.store(d, SIMD[F32, V](w).fma(vb.load[width=V](j * D + d), o.load[width=V](d)))
        for d in range(dv, D):
            o.store(d, o.load(d) + w * vb.load(j * D + d))
    var inv = 1.0 / total
    for d in range(0, dv, V):
        o.store(d, o.load[width=V](d) * inv)
    for d in range(dv, D):
        o.store(d, o.load(d) * inv)


@extensibility.register("cached_attention")
struct CachedAttention:
    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[dtype=F32, rank=3, ...],
        qkv: InputTensor[dtype=F32, rank=3, ...],
        keys: MutableInputTensor[dtype=F32, rank=4, ...],
        values: MutableInputTensor[dtype=F32, rank=4, ...],
        start: InputTensor[dtype=DType.int64, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var B = qkv.dim_size(0)
        var S = qkv.dim_size(1)
        var E = y.dim_size(2)
        var H = keys.dim_size(1)
        var C = keys.dim_size(2)
        var D = keys.dim_size(3)
        var past = Int(start.unsafe_ptr().load(0))
        if past + S > C:
            raise Error("cached_attention: ", past + S, " positions do not fit a cache of ", C)
        var xp = qkv.unsafe_ptr()
        var kp = keys.unsafe_ptr()
        var vp = values.unsafe_ptr()
        var op = y.unsafe_ptr()
        # The new rows first: every query of this call may look at them.
        for b in range(B):
            for s in range(S):
                for h in range(H):
                    var src = (b * S + s) * 3 * E + h * D
                    var dst = ((b * H + h) * C + past + s) * D
                    for d in range(D):
                        kp.store(dst + d, xp.load(src + E + d))
                        vp.store(dst + d, xp.load(src + 2 * E + d))

        var blocks = (S + QUERIES - 1) // QUERIES

        def work(task: Int) {var B, var S, var E, var H, var C, var D, var past, var blocks, var xp, var kp, var vp, var op}:
            var bh = task // blocks
            var b = bh // H
            var h = bh % H
            var first = (task % blocks) * QUERIES
            var p = alloc[Float32](past + min(first + QUERIES, S))
            for s in range(first, min(first + QUERIES, S)):
                attend(xp + (b * S + s) * 3 * E + h * D, kp + (b * H + h) * C * D, vp + (b * H + h) * C * D,
                       op + (b * S + s) * E + h * D, p, past + s + 1, D)
            p.free()

        parallelize(work, B * H * blocks)
