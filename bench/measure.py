"""Timing and peak memory, shared by the benchmark and its Hugging Face
baseline script (which runs in another interpreter, so this module imports
nothing of ours)."""

import resource
import statistics
import time
from pathlib import Path


def timed(fn, reps: int) -> float:
    """Median seconds of ``reps`` calls of ``fn``."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM, not ru_maxrss: Linux carries
    ru_maxrss across fork and exec, so a child would report its parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
