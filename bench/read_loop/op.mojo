# The read loop as a MAX custom op, for python -m bench.sections' in-graph
# figures: a graph of 49 of these, each waiting for the one before, runs 49
# parallel sections the way a decode step's 49 matmul ops do.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from std.memory import alloc
from std.sys.info import num_logical_cores

from .read import section


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
