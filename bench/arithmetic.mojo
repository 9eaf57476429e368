# The cores' float32 multiply-add peak, for `python -m bench.arithmetic`.
#
# Each task runs 24 independent chains of AVX-512 FMAs (16 float32 lanes
# each): enough chains to cover the FMA's latency on two ports, so the
# loop runs at the ports' throughput, with nothing read from memory.
# Printed per task count (1, then every logical core): the best of three
# runs, in 10^9 multiply-adds a second.

from max.algorithm import parallelize
from std.memory import stack_allocation
from std.sys.info import num_logical_cores
from std.time import perf_counter_ns

comptime V = 16
comptime CHAINS = 24
comptime ITERS = 10_000_000


def chains() -> Float32:
    var m = SIMD[DType.float32, V](1.0000001)
    var c = SIMD[DType.float32, V](1e-7)
    # As the kernels' accumulators: a stack array the compiler keeps in
    # registers once the loops over it are unrolled.
    var acc = stack_allocation[CHAINS * V, Float32]()
    comptime for i in range(CHAINS):
        acc.unsafe_store(i * V, SIMD[DType.float32, V](1))
    for _ in range(ITERS):
        comptime for i in range(CHAINS):
            acc.unsafe_store(i * V, acc.unsafe_load[width=V](i * V).fma(m, c))
    var s = Float32(0)
    comptime for i in range(CHAINS):
        s += acc.unsafe_load[width=V](i * V).reduce_add()
    return s


def main():
    var sums = List[Float32](length=num_logical_cores(), fill=0)
    var out = sums.unsafe_ptr()
    for tasks in [1, num_logical_cores()]:
        var best = Float64(1e30)
        for _ in range(3):
            var start = perf_counter_ns()

            def work(t: Int) {var out}:
                out.unsafe_store(t, chains())

            parallelize(work, tasks)
            best = min(best, Float64(perf_counter_ns() - start) / 1e9)
        print(tasks, Float64(tasks) * ITERS * CHAINS * V / best / 1e9, sums[0])
