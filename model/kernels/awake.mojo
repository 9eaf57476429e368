# Parallel work on cores kept awake between ops.
#
# MAX's parallelize ends each op's parallel section and starts the next op's
# on its runtime's workers. A decode step is a chain of ~50 matmul ops, each
# waiting for the one before, and each boundary costs MAX's runtime far more
# than the work dealt between two cores needs (`python -m bench.sections`).
# Here an op's calling thread and workers of this library's own, one per
# other core, share the op's work; between ops the workers wait awake a
# while (spinning), as llama.cpp's threads do, then yield their core, then
# sleep, so an idle process costs nothing.
#
# Nothing ever waits for a worker that is not running: a job is offered to
# the workers, and a worker takes part only by claiming it (a
# compare-and-swap) before the caller closes it. The caller deals its own
# share of the work items from the same counter as the workers, closes the
# job once no item is left, and waits only for the workers that claimed it
# (they hold items already taken). So on a machine whose cores are busy
# elsewhere, or before the workers have started, the caller does the work
# alone. One job at a time: a caller that finds the workers on another job
# (two graphs running at once) returns False and the op uses MAX's
# parallelize; so does a process forked from the one that started them.

from std.atomic import Atomic
from std.ffi import _get_global, external_call
from std.os import getenv
from std.memory import alloc
from std.sys import llvm_intrinsic
from std.sys.info import num_logical_cores
from std.time import perf_counter_ns

comptime CLOSED = Int64(-1)
comptime SEQ = Int64(1 << 20)  # `offer` holds the job's number times SEQ plus its claims
comptime SPIN_NS = 200_000  # a worker out of work spins this long (a decode step's op comes every ~0.1 ms)
comptime YIELD_NS = 2_000_000  # then yields its core to any thread that wants it for this long
comptime SLEEP_NS = 200_000  # then sleeps this long between looks (a job it misses the caller does)

# The pool's words (Atomic[Int64] each): its address is the process-wide global "gpt2_on_max_awake".
comptime LOCK = 0  # 1 while a caller holds the workers
comptime OFFER = 1  # the open job's number * SEQ + claims, or CLOSED
comptime FINISHED = 2  # claims of the current job done
comptime TASK = 3  # the job: a plain function's address...
comptime CONTEXT = 7  # ...and its argument's (the op's closure)
comptime PID = 4  # the process that started the workers
comptime WORKERS = 5  # how many it started
comptime JOBS = 6  # jobs offered so far
comptime STOP = 8  # 1: the workers end (the process is ending)
comptime ALIVE = 9  # workers still running
comptime WORDS = 16


@always_inline
def _pause():
    llvm_intrinsic["llvm.x86.sse2.pause", NoneType]()


def _pid() -> Int64:
    return Int64(external_call["getpid", Int32]())


def _worker(arg: OpaquePointer[MutAnyOrigin]) abi("C") -> OpaquePointer[MutAnyOrigin]:
    """A worker's life: claim each job offered, run its task, count it done."""
    var pool = arg.bitcast[Atomic[Int64]]()
    _ = external_call["pthread_setname_np", Int32](external_call["pthread_self", UInt64](), "gpt2-awake".unsafe_ptr())
    var last_job = Int64(0)
    var idle_since = Int(perf_counter_ns())
    while pool[STOP].load() == 0:
        var offer = pool[OFFER].load()
        if offer != CLOSED and offer // SEQ != last_job:
            var expected = offer
            if pool[OFFER].compare_exchange(expected, offer + 1):  # claimed: the caller waits for this one
                last_job = offer // SEQ
                var task = (pool + TASK).bitcast[Task]()[0]
                task(Int(pool[CONTEXT].load()))
                _ = pool[FINISHED].fetch_add(1)
                idle_since = Int(perf_counter_ns())
            continue
        var idle = Int(perf_counter_ns()) - idle_since
        if idle < Int(pool[10].load()):
            _pause()
        elif idle < Int(pool[11].load()):
            _ = external_call["sched_yield", Int32]()
        else:
            _ = external_call["usleep", Int32](UInt32(SLEEP_NS // 1000))
    _ = pool[ALIVE].fetch_add(-1)
    return arg


def _start() -> Optional[OpaquePointer[MutUntrackedOrigin]]:
    """The pool's words, its workers started (one per core but the caller's)."""
    var pool = alloc[Atomic[Int64]](WORDS)
    for i in range(WORDS):
        pool[i] = Atomic[Int64](0)
    pool[OFFER] = Atomic[Int64](CLOSED)
    pool[PID] = Atomic[Int64](_pid())
    var spin = SPIN_NS
    var yield_until = SPIN_NS + YIELD_NS
    try:
        spin = Int(getenv("AWAKE_SPIN_NS", String(SPIN_NS)))
        yield_until = Int(getenv("AWAKE_YIELD_NS", String(SPIN_NS + YIELD_NS)))
    except:
        pass
    pool[10] = Atomic[Int64](Int64(spin))
    pool[11] = Atomic[Int64](Int64(yield_until))
    var started = 0
    for _ in range(num_logical_cores() - 1):
        var thread = UInt64(0)
        if external_call["pthread_create", Int32](UnsafePointer(to=thread), Int(0), _worker,
                                                  pool.bitcast[NoneType]()) == 0:
            _ = external_call["pthread_detach", Int32](thread)
            started += 1
    pool[WORKERS] = Atomic[Int64](Int64(started))
    _ = pool[ALIVE].fetch_add(Int64(started))
    return pool.bitcast[NoneType]()


def _stop(pool: Optional[OpaquePointer[MutUntrackedOrigin]]):
    """At the runtime's end: the workers told to stop, and waited for (a
    worker left running would run code about to be unloaded), a second at most."""
    var words = pool.value().bitcast[Atomic[Int64]]()
    _ = words[STOP].fetch_add(1)
    var start = Int(perf_counter_ns())
    while words[ALIVE].load() > 0 and Int(perf_counter_ns()) - start < 1_000_000_000:
        _ = external_call["usleep", Int32](UInt32(100))


trait Dealt:
    """A job whose run() takes its items from the job's own shared counter
    until none is left: any number of threads running it, one included,
    cover every item once."""

    def run(self):
        ...


def _trampoline[J: Dealt](context: Int) abi("C"):
    """What a worker calls: the job's run(), the job passed by address."""
    UnsafePointer[J, MutAnyOrigin](unsafe_from_address=context)[].run()


comptime Task = def(Int) thin abi("C") -> None


def run_awake[J: Dealt](job: J) -> Bool:
    """job.run() on this thread and on every awake worker that claims it, at
    once; returns when all are done. False, with nothing run, where the
    workers cannot be had (another job holds them, a forked process, a
    single core): the caller then parallelizes through MAX."""
    var pool = _get_global["gpt2_on_max_awake", _start, _stop]().value().bitcast[Atomic[Int64]]()
    if pool[WORKERS].load() == 0 or pool[PID].load() != _pid():
        return False
    var free = Int64(0)
    if not pool[LOCK].compare_exchange(free, 1):
        return False
    var at = UnsafePointer(to=job)  # kept (used again below) while workers may read the job through its address
    (pool + TASK).bitcast[Task]()[0] = _trampoline[J]
    pool[CONTEXT] = Atomic[Int64](Int64(Int(at)))
    pool[FINISHED] = Atomic[Int64](0)
    var number = pool[JOBS].fetch_add(1) + 1
    _ = pool[OFFER].fetch_add(number * SEQ - CLOSED)  # CLOSED -> open, no claims: the workers may take it
    at[].run()  # this thread's share: once it runs out, every item is taken
    var claims = Int64(0)
    while True:  # close the job: no claim after this
        var offer = pool[OFFER].load()
        var expected = offer
        if pool[OFFER].compare_exchange(expected, CLOSED):
            claims = offer - number * SEQ
            break
    while pool[FINISHED].load() < claims:  # the claimers hold items already taken: short
        _pause()
    _ = pool[LOCK].fetch_add(-1)
    return True
