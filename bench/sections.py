"""``python -m bench.sections``: what a parallel section costs in MAX's runtime.

A decode step runs one parallel section per matmul (49 for GPT-2 124M), each
waiting for the one before, and each section starts its tasks on the
runtime's workers and waits for them to end. This builds
``bench/sections.mojo`` (with the mojo compiler in the max wheel) and reads
a decode step's float32 weight bytes (GPT-2 124M's matmul shapes) with a
plain vector loop on every core, as one section, as 49 sections in order,
and as 49 steps of one section separated by spinning barriers (what
llama.cpp's threads do between ops), alternated; it also times an empty
section. The difference between the three is only how the 48 boundaries
between matmuls are crossed.

Then the same loop inside a MAX graph, as a custom op
(``bench/read_loop/op.mojo``): one op reading all the bytes, against 49 ops
reading each matmul's bytes, each waiting for the one before (as a decode
step's 49 matmul ops do), alternated: the cost of a section boundary where
the model pays it. Both with MAX's background threads as MAX leaves them
and at the lowest priority, as the app runs them (model/engine_threads.py:
one of them wakes every 100 us, and on a machine with few cores each
wake-up takes a core from the reads). Last, the chain again with each op stamping when it is
called, when its tasks start and end and when it returns
(``sections_read_stamped``), which takes a boundary apart: the read loop's
own tail (one core done before the other) and the three steps of MAX's
runtime (ending the section, starting the next kernel, starting its tasks).

Why: inside the model this project's fp32 decode step is slower than its 49
matmuls back to back (``python -m bench.profile_decode``), and llama.cpp's is
not; this shows how much of it a section boundary is, with no model and no
kernel of this project's in the way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import mojo_program
from model.engine_threads import LOWEST

SOURCE = Path(__file__).with_name("sections.mojo")
PACKAGE = Path(__file__).with_name("read_loop")  # the read loop, and the op that runs it in a graph
BLOCK = 10  # in-graph calls of each kind between two priority changes
STAMP_TASKS = 64  # room for each task's start and end in a stamped op's output: op.mojo's MAX_TASKS
# A boundary between two chained ops, taken apart from the stamped ops' times:
# (what, from, to, whose time it is).
PARTS = (("first_idle", "first core out of work -> last core out of work", "the read loop's last chunks"),
         ("join", "last core out of work -> the op returns", "MAX's runtime ends the section"),
         ("dispatch", "the op returns -> the next op is called", "MAX's runtime starts the next kernel"),
         ("start", "the next op is called -> its first task reads", "MAX's runtime starts the section's tasks"))


def measure(passes: int) -> dict[str, float]:
    """The program's figures: cores, bytes, sections, empty_us, one_ms, split_ms, spin_ms."""
    out = mojo_program.run(SOURCE, str(passes), include=PACKAGE.parent)
    return {name: float(value) for name, value in (line.split() for line in out.splitlines())}


def boundary_parts(stamps) -> dict[str, float]:
    """Where the time between two chained ops goes, from the stamped ops'
    outputs ``stamps`` [calls, ops, 4 + 2 * STAMP_TASKS] (nanoseconds; see
    op.mojo's SectionsReadStamped): the median over every boundary of every
    call of each of PARTS, in microseconds."""
    import numpy as np

    tasks = int(stamps[0, 0, 2])
    called, returned = stamps[..., 0], stamps[..., 1]
    starts = stamps[..., 4:4 + tasks]
    ends = stamps[..., 4 + STAMP_TASKS:4 + STAMP_TASKS + tasks]
    last_end = ends.max(-1)
    # The boundaries only: an op's end borders the next op's start, and the
    # last op's end and the first op's start border no other op.
    gaps = {"first_idle": (last_end - ends.min(-1))[:, :-1], "join": (returned - last_end)[:, :-1],
            "dispatch": called[:, 1:] - returned[:, :-1], "start": (starts.min(-1) - called)[:, 1:]}
    return {key: float(np.median(gap)) / 1e3 for key, gap in gaps.items()}


def priority_blocks(passes: int, alternate: bool) -> list[tuple[str, int | None, int]]:
    """The in-graph timing's order: (suffix, nice to give MAX's background
    threads first or None to leave them, calls) blocks, suffix "" for the
    threads as MAX leaves them (nice 0) and "_quiet" for nice 19. Alternated
    in blocks of BLOCK calls where this process may raise a priority back
    (``passes`` rounded up to whole blocks); elsewhere all calls as MAX
    leaves the threads first, untouched, then all at nice 19."""
    if not alternate:
        return [("", None, passes), ("_quiet", LOWEST, passes)]
    return [("", 0, BLOCK), ("_quiet", LOWEST, BLOCK)] * -(-passes // BLOCK)


def in_graph(passes: int) -> dict[str, float]:
    """The same bytes read inside MAX graphs by bench/read_loop/op.mojo's
    op: one_ms (one op), split_ms (49 ops in a chain); medians of
    ``passes`` alternated calls. Then, with MAX's background threads at the
    lowest priority, the chain of stamped ops: boundary_parts()."""
    import statistics
    import time

    import numpy as np
    from max.driver import CPU, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    from bench.kernels import STEP_SHAPES
    from model.graph import one_module
    from model.layers.custom_op import mojo_library

    sizes = [rows * cols for rows, cols in STEP_SHAPES]
    whole = np.full(sum(sizes), 0.001, np.float32)
    edges = np.cumsum([0, *sizes])
    cpu = DeviceRef.CPU()

    def vector(n: int) -> TensorType:
        return TensorType(DType.float32, [n], device=cpu)

    library = mojo_library(PACKAGE)  # the same path every run: MAX's cache finds the graphs compiled with it
    with Graph("sections_one", input_types=[vector(len(whole))], custom_extensions=[library]) as one:
        zero = ops.constant(np.zeros(1, np.float32), DType.float32, cpu)
        one.output(ops.custom("sections_read", cpu, [one.inputs[0], zero], [vector(1)])[0])
    with Graph("sections_split", input_types=[vector(n) for n in sizes], custom_extensions=[library]) as split:
        last = ops.constant(np.zeros(1, np.float32), DType.float32, cpu)
        for part in split.inputs:
            last = ops.custom("sections_read", cpu, [part, last], [vector(1)])[0]
        split.output(last)
    stamp = TensorType(DType.float64, [4 + 2 * STAMP_TASKS], device=cpu)
    with Graph("sections_stamped", input_types=[vector(n) for n in sizes], custom_extensions=[library]) as stamped:
        outs = [ops.constant(np.zeros(4 + 2 * STAMP_TASKS), DType.float64, cpu)]
        for part in stamped.inputs:
            outs.append(ops.custom("sections_read_stamped", cpu, [part, outs[-1]], [stamp])[0])
        stamped.output(*outs[1:])
    session = InferenceSession(devices=[CPU()], custom_extensions=[library])
    # The three graphs compiled as one unit: most of a compile is paid once per compile.
    loaded = session.load_all(one_module([one, split, stamped]))
    stamped = loaded["sections_stamped"]
    models = {"one_ms": (loaded["sections_one"], [Buffer.from_numpy(whole)]),
              "split_ms": (loaded["sections_split"], [Buffer.from_numpy(whole[a:b]) for a, b in zip(edges, edges[1:])])}
    from model.engine_threads import background_threads, may_raise_priority, set_priority

    for model, args in models.values():
        for _ in range(3):  # the first calls after loading run slower (and MAX starts its threads)
            model.execute(*args)
    background = background_threads()
    # Each figure also with MAX's background threads at the lowest priority
    # (as the app runs; model/engine_threads.py), alternated with them as
    # MAX leaves them where this process may raise their priority back;
    # elsewhere as MAX leaves them first, then lowered.
    alternate = may_raise_priority()
    # In blocks of BLOCK calls: the scheduler carries a thread's past share
    # across a priority change for a while (toggled at every call, the two
    # read nearly the same; in blocks, apart).
    times: dict[str, list[float]] = {f"{key}{quiet}": [] for quiet in ("", "_quiet") for key in models}
    for quiet, nice, calls in priority_blocks(passes, alternate):
        if nice is not None:
            set_priority(background, nice)
        for _ in range(calls):
            for key, (model, args) in models.items():  # alternated, so that drift hits both alike
                start = time.perf_counter()
                model.execute(*args)
                times[key + quiet].append((time.perf_counter() - start) * 1e3)
    set_priority(background, LOWEST)
    figures = {key: statistics.median(t) for key, t in times.items()}
    figures["alternated"] = float(alternate)
    split_args = models["split_ms"][1]
    for _ in range(3):
        stamped.execute(*split_args)
    calls = [np.stack([out.to_numpy() for out in stamped.execute(*split_args)]) for _ in range(passes)]
    return figures | boundary_parts(np.stack(calls))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sections", description=__doc__.split("\n\n")[0])
    p.add_argument("--passes", type=int, default=40,
                   help="passes over the bytes in each form; medians are printed (default 40)")
    p.add_argument("--no-graph", dest="graph", action="store_false",
                   help="skip the in-graph figures (the standalone program's only)")
    args = p.parse_args(argv)
    f = measure(args.passes)
    boundaries = int(f["sections"]) - 1
    print(f"a decode step's float32 weights (GPT-2 124M's {int(f['sections'])} matmuls, {f['bytes'] / 1e6:.0f} MB), "
          f"read by {int(f['cores'])} cores, medians of {args.passes} passes:")
    print(f"  one parallel section:                        {f['one_ms']:6.2f} ms "
          f"({f['bytes'] / f['one_ms'] / 1e6:.1f} GB/s)")
    for key, what in (("split_ms", "one section per matmul (MAX's runtime):"),
                      ("spin_ms", "one section, spinning barriers between:")):
        extra = (f[key] - f["one_ms"]) * 1e3 / boundaries
        print(f"  {what:<45}{f[key]:6.2f} ms: {extra:+.1f} us a boundary")
    print(f"  an empty parallel section, back to back:     {f['empty_us']:6.1f} us")
    if args.graph:
        g = in_graph(args.passes)
        order = "alternated" if g["alternated"] else "one after the other (raising a priority back needs privileges)"
        print(f"the same loop as a MAX custom op, in a graph (medians of {args.passes} calls each, {order}):")
        for quiet, what in (("", "MAX's background threads as MAX leaves them"),
                            ("_quiet", "MAX's background threads at nice 19 (as the app runs)")):
            one, split = g["one_ms" + quiet], g["split_ms" + quiet]
            print(f"  {what}:")
            print(f"    one op over all the bytes:                 {one:6.2f} ms ({f['bytes'] / one / 1e6:.1f} GB/s)")
            print(f"    {'one op per matmul, each after the last:':<43}{split:6.2f} ms: "
                  f"{(split - one) * 1e3 / boundaries:+.1f} us a boundary")
        print(f"  a boundary between two of the 49 ops, taken apart (each op stamps when it is called, when its\n"
              f"  tasks start and end, and when it returns; medians over {boundaries} boundaries x "
              f"{args.passes} calls, MAX's\n  background threads at nice 19):")
        for key, what, whose in PARTS:
            print(f"    {what:<48}{g[key]:6.1f} us  ({whose})")
        total = sum(g[key] for key, _, _ in PARTS)
        print(f"    {'from a core out of work to the next op reading:':<48}{total:6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
