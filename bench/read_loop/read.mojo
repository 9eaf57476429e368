# The read loop that python -m bench.sections times: a plain vector loop over
# float32 bytes, dealt to every core in 96 KB chunks from an atomic counter
# (as model/kernels/matmul.mojo's ops deal their rows), as one parallel
# section (section) or as several matmuls' bytes in one section with
# spinning barriers between them (spinning). bench/sections.mojo runs it
# in a standalone program, op.mojo as a MAX custom op.

from max.algorithm import parallelize
from std.atomic import Atomic
from std.memory import alloc
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


def section_stamped(buf: UnsafePointer[Float32, _], n: Int, tasks: Int, sums: UnsafePointer[mut=True, Float32, _],
                    starts: UnsafePointer[mut=True, Float64, _], ends: UnsafePointer[mut=True, Float64, _]):
    """section() in ``tasks`` tasks, each writing when it starts and ends (perf_counter_ns)
    to starts[t] and ends[t]: where the time of a boundary goes."""
    var taken = Atomic[Int64](0)
    var done = Atomic[Int64](0)
    var tp = UnsafePointer(to=taken)
    var dp = UnsafePointer(to=done)

    def work(t: Int) {var buf, var n, var sums, var tp, var dp, var starts, var ends}:
        starts[t] = Float64(perf_counter_ns())
        sums[t] += read_chunks(buf, n, tp, dp)
        ends[t] = Float64(perf_counter_ns())

    parallelize(work, tasks)


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
