# The read loop as a MAX custom op, for python -m bench.sections' in-graph
# figures: a graph of 49 of these, each waiting for the one before, runs 49
# parallel sections the way a decode step's 49 matmul ops do. The stamped
# form also says when it was called, when its tasks started and ended and
# when it returned, so that a boundary's cost can be taken apart.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from std.memory import alloc
from std.sys.info import num_logical_cores
from std.time import perf_counter_ns

from .read import section, section_stamped

comptime MAX_TASKS = 64  # the stamps' room: one start and one end per task


@extensibility.register("sections_read")
struct SectionsRead:
    """Reads x as one parallel section (read.mojo's section()); y[0] is the
    sum, plus after[0] * 0: an input that makes the op wait for the op
    before it, as a matmul waits for the one before."""

    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[dtype=DType.float32, rank=1, ...],
        x: InputTensor[dtype=DType.float32, rank=1, ...],
        after: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var sums = alloc[Float32](num_logical_cores())
        for t in range(num_logical_cores()):
            sums[t] = 0
        section(x.unsafe_ptr(), x.dim_size(0), sums)
        var s = after.unsafe_ptr()[0] * 0
        for t in range(num_logical_cores()):
            s += sums[t]
        y.unsafe_ptr()[0] = s
        sums.free()


@extensibility.register("sections_read_stamped")
struct SectionsReadStamped:
    """SectionsRead, with times (perf_counter_ns, float64): y[0] when the op
    was called, y[1] when it returned, y[2] its task count T, y[3] the sum
    (plus after[3] * 0, the wait for the op before), then the tasks' starts
    in y[4:4 + T] and their ends in y[4 + MAX_TASKS:4 + MAX_TASKS + T]."""

    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[dtype=DType.float64, rank=1, ...],
        x: InputTensor[dtype=DType.float32, rank=1, ...],
        after: InputTensor[dtype=DType.float64, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var called = Float64(perf_counter_ns())
        var tasks = min(num_logical_cores(), MAX_TASKS)
        var stamps = y.unsafe_ptr()
        var sums = alloc[Float32](tasks)
        for t in range(tasks):
            sums[t] = 0
        section_stamped(x.unsafe_ptr(), x.dim_size(0), tasks, sums, stamps + 4, stamps + 4 + MAX_TASKS)
        var s = after.unsafe_ptr()[3] * 0
        for t in range(tasks):
            s += Float64(sums[t])
        sums.free()
        stamps[0] = called
        stamps[2] = Float64(tasks)
        stamps[3] = s
        stamps[1] = Float64(perf_counter_ns())
