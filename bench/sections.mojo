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
# differs. Printed: one line per figure, medians over the passes. The read
# loop is bench/read_loop/read.mojo's, which its op.mojo also runs inside a
# MAX graph (python -m bench.sections' in-graph figures). This program leaves
# the op out: with the op's library imported, an empty section here took
# ~235 us instead of ~15.

from max.algorithm import parallelize
from std.memory import alloc
from std.sys import argv
from std.sys.info import num_logical_cores
from std.time import perf_counter_ns

from read_loop.read import section, spinning


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
