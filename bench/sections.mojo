# What a parallel section costs in MAX's runtime, for `python -m bench.sections`.
#
# A decode step runs one parallel section per matmul (49 for GPT-2 124M),
# each waiting for the one before. This reads the same bytes as a decode
# step's float32 weights (GPT-2 124M's matmul shapes, 494 MB) with a plain
# vector loop, dealt to every core in 96 KB chunks from an atomic counter
# (as model/kernels/matmul.mojo's ops deal their rows), three ways, and
# times an empty section:
#   empty  an empty section (every core's task does nothing), back to back;
#   one    all the bytes in one section;
#   split  the same bytes as 49 sections, one per matmul, in order;
#   spin   one section in which the cores go through the 49 matmuls' bytes
#          in order, waiting for each other between two on a shared counter
#          (a spinning barrier, as llama.cpp's threads do between ops).
# split - one is what 48 section boundaries cost in MAX's runtime, spin -
# one what the same 48 boundaries cost as spinning barriers; nothing else
# differs. Printed: one line per figure, medians over the passes.

from max.algorithm import parallelize
from std.atomic import Atomic
from std.memory import alloc
from std.sys import argv
from std.sys.info import num_logical_cores
from std.time import perf_counter_ns

comptime V = 16  # float32 lanes of one AVX-512 register
comptime CHUNK = 24 * 1024  # floats a core takes at a time (96 KB)


@always_inline
def read(p: UnsafePointer[Float32, _], n: Int) -> Float32:
    """The sum of p[0:n] (n a multiple of 4 * V): four vector streams."""
    var a0 = SIMD[DType.float32, V](0)
    var a1 = SIMD[DType.float32, V](0)
    var a2 = SIMD[DType.float32, V](0)
    var a3 = SIMD[DType.float32, V](0)
    for i in range(0, n, 4 * V):
        a0 += p.load[width=V](i)
        a1 += p.load[width=V](i + V)
        a2 += p.load[width=V](i + 2 * V)
        a3 += p.load[width=V](i + 3 * V)
    return (a0 + a1 + a2 + a3).reduce_add()


def read_chunks(
    buf: UnsafePointer[Float32, _], n: Int, taken: UnsafePointer[mut=True, Atomic[Int64], _],
    done: UnsafePointer[mut=True, Atomic[Int64], _],
) -> Float32:
    """Reads the chunks of buf[0:n] that this core takes from the counter
    ``taken`` until none is left, counting each one read in ``done``: the
    same work in every form, so only the boundaries differ."""
    var s = Float32(0)
    var chunks = (n + CHUNK - 1) // CHUNK
    while True:
        var c = Int(taken[].fetch_add(1))
        if c >= chunks:
            return s
        s += read(buf + c * CHUNK, min(CHUNK, n - c * CHUNK))
        _ = done[].fetch_add(1)


def section(buf: UnsafePointer[Float32, _], n: Int, sums: UnsafePointer[mut=True, Float32, _]):
    """One parallel section reading buf[0:n], chunks dealt from a counter."""
    var taken = Atomic[Int64](0)
    var done = Atomic[Int64](0)
    var tp = UnsafePointer(to=taken)
    var dp = UnsafePointer(to=done)

    def work(t: Int) {var buf, var n, var sums, var tp, var dp}:
        sums[t] += read_chunks(buf, n, tp, dp)

    parallelize(work, num_logical_cores())


def spinning(buf: UnsafePointer[Float32, _], sizes: List[Int], sums: UnsafePointer[mut=True, Float32, _]):
    """One parallel section over every matmul's bytes in order: a matmul's
    chunks are dealt from its own counter, and a core out of chunks waits
    until every chunk taken has been read (done[j] reaches the count) before
    the next matmul. It waits only on chunks a running core has taken, so it
    cannot deadlock if the runtime starts fewer tasks at once."""
    var m = len(sizes)
    var taken = alloc[Atomic[Int64]](m)
    var done = alloc[Atomic[Int64]](m)
    for j in range(m):
        taken[j] = Atomic[Int64](0)
        done[j] = Atomic[Int64](0)
    var sp = sizes.unsafe_ptr()

    def work(t: Int) {var buf, var sums, var m, var taken, var done, var sp}:
        var s = Float32(0)
        var at = 0
        for j in range(m):
            var n = sp[j]
            s += read_chunks(buf + at, n, taken + j, done + j)
            while Int(done[j].load()) < (n + CHUNK - 1) // CHUNK:  # the barrier: spin
                pass
            at += n
        sums[t] += s

    parallelize(work, num_logical_cores())
    taken.free()
    done.free()


def median(mut times: List[Float64]) -> Float64:
    sort(times)
    return times[len(times) // 2]


def main() raises:
    var passes = Int(argv()[1]) if len(argv()) > 1 else 40
    var sizes = List[Int]()  # a decode step's matmuls, in order: [out, in] of each
    for _ in range(12):
        sizes.append(2304 * 768)  # c_attn
        sizes.append(768 * 768)  # attn c_proj
        sizes.append(3072 * 768)  # c_fc
        sizes.append(768 * 3072)  # mlp c_proj
    sizes.append(50257 * 768)  # the LM head
    var n = 0
    for s in sizes:
        n += s
    var buf = alloc[Float32](n)
    for i in range(n):
        buf[i] = Float32(i % 7) * 0.001
    var sums = alloc[Float32](num_logical_cores())
    for t in range(num_logical_cores()):
        sums[t] = 0

    var empty = List[Float64]()
    for _ in range(passes):
        var start = perf_counter_ns()
        for _ in range(100):
            def nothing(t: Int) {var sums}:
                sums[t] += 0

            parallelize(nothing, num_logical_cores())
        empty.append(Float64(perf_counter_ns() - start) / 100 / 1e3)

    var one = List[Float64]()
    var split = List[Float64]()
    var spin = List[Float64]()
    for _ in range(passes):  # alternated, so that drift hits the three alike
        var start = perf_counter_ns()
        section(buf, n, sums)
        one.append(Float64(perf_counter_ns() - start) / 1e6)
        start = perf_counter_ns()
        var at = 0
        for s in sizes:
            section(buf + at, s, sums)
            at += s
        split.append(Float64(perf_counter_ns() - start) / 1e6)
        start = perf_counter_ns()
        spinning(buf, sizes, sums)
        spin.append(Float64(perf_counter_ns() - start) / 1e6)

    print("cores", num_logical_cores())
    print("bytes", n * 4)
    print("sections", len(sizes))
    print("empty_us", median(empty))
    print("one_ms", median(one))
    print("split_ms", median(split))
    print("spin_ms", median(spin))
    print("checksum", sums[0])
