"""MAX's background threads at the lowest CPU priority, so that they do not
take the cores from the compute workers.

Why: MAX 26.7's engine starts a thread on a process's first graph execution
(a singleton made in ``executeFromDriver``) that waits on a condition
variable with a 100 us timeout in a loop, for the life of the process: it
wakes thousands of times a second whether a graph runs or not
(``/proc/self/task/<tid>/stat``; ``strace``: only futex calls).
On a machine with few cores every wake-up preempts one of the threads that
read the weights (the figures: docs/decisions/0007-background-threads-nice-19.md).
At nice 19 the thread still runs, only after the compute threads
(SCHED_IDLE did as well but can starve it on a busy machine).

What is lowered: the unnamed native threads of this process, i.e. every
thread that is not a Python thread (the caller's, the main one, any the user
started) and still carries the process's own name (the main thread's): MAX's
background threads. MAX names its CPU workers ("🔥 Thread<n>"), and the
libraries a server process also runs name theirs (libzmq "ZMQbg/...", libuv
"libuv-worker"): those keep their priority. Linux only (per-thread
priorities through /proc); elsewhere nothing is done.
"""

from __future__ import annotations

import os
import sys
import threading

LOWEST = 19  # the nicest nice value

_done = False


def background_threads() -> list[int]:
    """The ids of MAX's background threads in this process (see the top of
    this file); empty where /proc is not there."""
    tasks = f"/proc/{os.getpid()}/task"
    if not sys.platform.startswith("linux") or not os.path.isdir(tasks):
        return []
    python = {t.native_id for t in threading.enumerate()} | {threading.get_native_id()}
    unnamed = _name(f"{tasks}/{os.getpid()}")  # the process's own name, which a thread keeps unless named
    if unnamed is None:
        return []
    return [int(tid) for tid in os.listdir(tasks) if int(tid) not in python and _name(f"{tasks}/{tid}") == unnamed]


def _name(task: str) -> str | None:
    """A thread's name (its comm), or None if it ended meanwhile."""
    try:
        with open(f"{task}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def may_raise_priority() -> bool:
    """Whether this process may set a thread's priority back up to nice 0
    (root, or an RLIMIT_NICE that allows it)."""
    import resource

    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


def set_priority(tids: list[int], nice: int) -> None:
    """Each thread of ``tids`` to ``nice``. Raising a priority back (a lower
    nice) needs privileges (``may_raise_priority``): PermissionError without them."""
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # ended meanwhile
            pass


def quiet_background_threads() -> list[int]:
    """Lower MAX's background threads to nice 19, once per process, after
    its first graph execution (the thread above exists from then on); the
    ids lowered. Later calls do nothing."""
    global _done
    if _done:
        return []
    _done = True
    lowered = background_threads()
    set_priority(lowered, LOWEST)  # lowering one's own threads needs no privilege
    return lowered
