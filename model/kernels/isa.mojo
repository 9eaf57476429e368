# Which instructions model/kernels use: one compile-time choice per op call.
#
# Every op takes two compile-time parameters (model/cpu.py passes them):
# `isa1`, the path of its tile for one input row (a batch-1 decode step),
# and `isa`, the path for several. They differ where a CPU runs one shape
# faster on another path (AMD's Zen 4 decodes faster on 32-byte vectors:
# docs/cpu.md). AUTO picks from the compile target, MAX's view of the CPU
# at hand; the others force a path, so that a machine with AVX-512 also
# runs, and its tests check, the code an AVX2-only CPU runs. A forced path
# the CPU lacks would stop on an illegal instruction: model/cpu.py refuses
# it first.
#
#   AVX512_VNNI  64-byte vectors; 8-bit dot products with vpdpbusd
#   AVX512_VNNI_256  the same instructions on 32-byte vectors (AVX-512VL)
#   AVX2         32-byte vectors (16 registers); 8-bit dot products with
#                vpmaddubsw then vpmaddwd, llama.cpp's AVX2 form
#   PORTABLE     the target's own vector width, plain arithmetic: any CPU
#                MAX runs on (Arm included), slower

from std.memory import bitcast
from std.sys import llvm_intrinsic
from std.sys.info import CompilationTarget, simd_byte_width

comptime AUTO = 0
comptime AVX512_VNNI = 1
comptime AVX2 = 2
comptime PORTABLE = 3
comptime AVX512_VNNI_256 = 4


def has_vnni(isa: Int) -> Bool:
    """Whether the path's 8-bit dot products are vpdpbusd (either width)."""
    return isa == AVX512_VNNI or isa == AVX512_VNNI_256


def resolved(isa: Int) -> Int:
    """The path AUTO stands for on the compile target; a forced one as it is."""
    if isa != AUTO:
        return isa
    if CompilationTarget.has_avx512f() and CompilationTarget.has_vnni():
        return AVX512_VNNI
    if CompilationTarget.has_avx2():
        return AVX2
    return PORTABLE


def vector_bytes(isa: Int) -> Int:
    """Bytes in one vector register of the path."""
    if isa == AVX512_VNNI:
        return 64
    if isa == AVX2 or isa == AVX512_VNNI_256:
        return 32
    return simd_byte_width()


def registers(isa: Int) -> Int:
    """Vector registers the path's tiles may plan for (AVX-512 has 32,
    AVX2 16; the portable path assumes the smaller file)."""
    return 32 if has_vnni(isa) else 16


@always_inline
def _avx2_dot4(acc: SIMD[DType.int32, 8], u: SIMD[DType.uint8, 32], s: SIMD[DType.int8, 32]) -> SIMD[DType.int32, 8]:
    """AVX2's 4-wide 8-bit dot product: vpmaddubsw (pairs into int16, saturating), then vpmaddwd by 1."""
    var pairs = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 16]](u, s)
    return acc + llvm_intrinsic["llvm.x86.avx2.pmadd.wd", SIMD[DType.int32, 8]](pairs, SIMD[DType.int16, 16](1))


@always_inline
def _avx2_signed_dot4(acc: SIMD[DType.int32, 8], w: SIMD[DType.int8, 32], x: SIMD[DType.int8, 32]) -> SIMD[DType.int32, 8]:
    """|w| times x with w's sign (vpsignb), then _avx2_dot4: llama.cpp's AVX2 form for two signed operands."""
    var signed_x = llvm_intrinsic["llvm.x86.avx2.psign.b", SIMD[DType.int8, 32]](x, w)
    return _avx2_dot4(acc, bitcast[DType.uint8, 32](abs(w)), signed_x)


@always_inline
def _widened_dot4(acc: SIMD[DType.int32, 8], a: SIMD[DType.int32, 32]) -> SIMD[DType.int32, 8]:
    """acc plus the sums of 4 neighbouring lanes of a (the portable path's products)."""
    var a2 = a.deinterleave()[0] + a.deinterleave()[1]
    return acc + a2.deinterleave()[0] + a2.deinterleave()[1]


@always_inline
def dot4_32[isa: Int](acc: SIMD[DType.int32, 8], u: SIMD[DType.uint8, 32], s: SIMD[DType.int8, 32]) -> SIMD[DType.int32, 8]:
    """The sums of 4 neighbouring products u * s added to acc (lane i: bytes 4i..4i+3).

    AVX2 sums each pair in int16 first (vpmaddubsw saturates there), so a
    caller keeps 2 * u * |s| within 32767: u <= 127 with |s| <= 128."""
    comptime if has_vnni(isa):
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.256", SIMD[DType.int32, 8]](acc, bitcast[DType.int8, 32](u), s)
    elif isa == AVX2:
        return _avx2_dot4(acc, u, s)
    else:
        return _widened_dot4(acc, u.cast[DType.int32]() * s.cast[DType.int32]())


@always_inline
def dot4_64[isa: Int](acc: SIMD[DType.int32, 16], u: SIMD[DType.uint8, 64], s: SIMD[DType.int8, 64]) -> SIMD[DType.int32, 16]:
    """dot4_32 on 64 bytes: one vpdpbusd on AVX512_VNNI, two halves elsewhere."""
    comptime if isa == AVX512_VNNI:
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.512", SIMD[DType.int32, 16]](acc, bitcast[DType.int8, 64](u), s)
    else:
        var lo = dot4_32[isa](acc.slice[8, offset=0](), u.slice[32, offset=0](), s.slice[32, offset=0]())
        var hi = dot4_32[isa](acc.slice[8, offset=8](), u.slice[32, offset=32](), s.slice[32, offset=32]())
        return lo.join(hi)


@always_inline
def signed_dot4[isa: Int, L: Int](acc: SIMD[DType.int32, L], w: SIMD[DType.int8, 4 * L], x: SIMD[DType.int8, 4 * L]) -> SIMD[DType.int32, L]:
    """The sums of 4 neighbouring products w * x added to acc (L lanes of 8
    or 16), both signed codes in -127..127 (Q8_0's). The VNNI paths make w
    unsigned (+128) for vpdpbusd, so each lane is 128 * (its 4 x codes
    summed) too much: the caller takes that back out once per block. AVX2
    multiplies |w| by x with w's sign (vpsignb), as llama.cpp does, so no
    pair leaves int16; the portable path widens to int32."""
    comptime assert L == 8 or L == 16, "one 32- or 64-byte vector"
    comptime if has_vnni(isa):
        var u = bitcast[DType.uint8, 4 * L](w) ^ 128
        comptime if L == 16:  # dot4_64 splits it in two for the 256-bit path
            return rebind[SIMD[DType.int32, L]](dot4_64[isa](
                rebind[SIMD[DType.int32, 16]](acc), rebind[SIMD[DType.uint8, 64]](u), rebind[SIMD[DType.int8, 64]](x)))
        else:
            return rebind[SIMD[DType.int32, L]](dot4_32[isa](
                rebind[SIMD[DType.int32, 8]](acc), rebind[SIMD[DType.uint8, 32]](u), rebind[SIMD[DType.int8, 32]](x)))
    elif L == 16:  # two 32-byte halves
        var lo = signed_dot4[isa, 8](acc.slice[8, offset=0](), w.slice[32, offset=0](), x.slice[32, offset=0]())
        var hi = signed_dot4[isa, 8](acc.slice[8, offset=8](), w.slice[32, offset=32](), x.slice[32, offset=32]())
        return rebind[SIMD[DType.int32, L]](lo.join(hi))
    elif isa == AVX2:
        return rebind[SIMD[DType.int32, L]](_avx2_signed_dot4(
            rebind[SIMD[DType.int32, 8]](acc), rebind[SIMD[DType.int8, 32]](w), rebind[SIMD[DType.int8, 32]](x)))
    else:
        var p = w.cast[DType.int32]() * x.cast[DType.int32]()
        return rebind[SIMD[DType.int32, L]](_widened_dot4(rebind[SIMD[DType.int32, 8]](acc), rebind[SIMD[DType.int32, 32]](p)))
