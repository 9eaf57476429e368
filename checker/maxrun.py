"""Running learner modules on MAX, the fast way for many small variants.

Every learner edit is a new program. Compiling it as a graph costs 45-100 s on
a 2-core machine; running it eagerly on MAX's warmed interpreter cache costs
seconds. So checks build modules under ``F.lazy()`` (no random init, which
would be eager work), load fixed weights with ``load_state_dict``, and call
them eagerly on numpy inputs.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager, redirect_stderr

import numpy as np

from checker.harness import CheckFailed, to_numpy
from model.device import hide_gpus

# (batch, sequence length): batch 1 and 2, a single token, a short and a long
# (> 64) sequence.
SHAPES = [(1, 1), (2, 7), (2, 70)]
KEEP_GPUS = "GPT2_MAX_CHECKER_GPUS"  # "1": the checker leaves the GPUs in MAX's sight


def without_gpus() -> None:
    """Hide the GPUs from this process and its children, before MAX first
    looks for devices: called where the checker's own processes start
    (``python -m checker``, ``python -m checker.show``), never in the app,
    whose later children may want a GPU. The checks run on the
    CPU on every machine (``interpreter()``); a GPU in MAX's sight keeps the
    shipped CPU kernels out (checker/eager_kernels), so every eager op
    compiles on first use: minutes for a first check on a GPU machine, seconds
    with the GPUs hidden (docs/gpu.md). ``GPT2_MAX_CHECKER_GPUS=1`` leaves them
    in sight, should a MAX release mind not seeing a GPU its machine has."""
    if os.environ.get(KEEP_GPUS) != "1":
        hide_gpus()


class WithoutStoreLines:
    """A stream that passes on everything but MAX's line for each op family it
    loads from a warm store ("[eager-warm] loaded binary from the warm store
    ..."; checker/eager_kernels names one): what a check prints is the checks'."""

    MARK = "[eager-warm] "

    def __init__(self, stream):
        self.stream, self.dropping = stream, False

    def write(self, text: str) -> int:
        drop = text.startswith(self.MARK) or (self.dropping and text == "\n")  # print() writes the end apart
        self.dropping = text.startswith(self.MARK)
        return len(text) if drop else self.stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextmanager
def interpreter():
    """Run eager MAX work in the interpreter alone, on the CPU in float32.

    MAX's default ("composite") executor also starts background compiles that
    compete for the cores; on a 2-core machine the interpreter alone made the
    checks 1.5-2x faster. Scoped, so that code outside the checks keeps MAX's
    default (the interpreter refuses some of the app's work, bfloat16 casts).
    An explicit MAX_EAGER_EXECUTOR in the environment wins.

    On a machine with a GPU, MAX puts new tensors on the GPU in bfloat16 by
    default; the checks compare with numpy's float32 on every machine, so
    the tensors a step creates (a mask, a LayerNorm's weights) are put on the
    CPU in float32 here, beside the numpy inputs."""
    from checker import eager_kernels

    eager_kernels.use()  # the kernels shipped for this machine's CPU level, where it can take them (once)
    from max.driver import CPU
    from max.dtype import DType
    from max.experimental.tensor import default_device, default_dtype

    with default_device(CPU()), default_dtype(DType.float32), redirect_stderr(WithoutStoreLines(sys.stderr)):
        if os.environ.get("MAX_EAGER_EXECUTOR"):
            yield
            return
        from max.experimental.executor import InterpreterExecutor, set_default_executor

        with set_default_executor(InterpreterExecutor()):
            yield


def build(cls, *args, weights: dict[str, np.ndarray] | None = None, **kwargs):
    """``cls(*args, **kwargs)`` built lazily, then loaded with ``weights``."""
    from max.experimental import functional as F

    with interpreter():
        with F.lazy():
            module = cls(*args, **kwargs)
        if weights is not None:
            module.load_state_dict(weights)
    return module


def tensor(array: np.ndarray):
    from max.experimental.tensor import Tensor

    return Tensor.from_dlpack(np.ascontiguousarray(array))


def run(module, *inputs, what: str = "forward", **kwargs):
    """Call ``module`` on numpy inputs (None passes through) and return its
    result with every tensor turned into numpy (tuples and lists kept).

    The call is traced under ``F.lazy()`` and realised once at the end: one
    interpreted graph per call, 2-3x faster than running op by op."""
    return lazily(module, *(None if x is None else tensor(x) for x in inputs), what=what, **kwargs)


def lazily(fn, *args, what: str = "forward", **kwargs):
    """``fn(*args, **kwargs)`` traced lazily, realised as numpy."""
    from max.experimental import functional as F

    with interpreter():
        with F.lazy():
            result = fn(*args, **kwargs)
        return numpy_tree(result, what)


STAYS_IN_CACHE = "forward returns the output alone now; the keys and values stay in the cache"


def output_alone(result, what: str, hint: str):
    """``result`` when forward returned one tensor; CheckFailed when it returned a
    tuple (output, keys, values): the cache it was handed keeps those."""
    if isinstance(result, (tuple, list)):
        raise CheckFailed(f"{what} returned a tuple of {len(result)}: {STAYS_IN_CACHE}", hint)
    return result


def cache_of(cls, past: tuple[np.ndarray, np.ndarray] | None = None):
    """A ``cls`` (step 07's ConcatCache: the learner's or the solution's) holding
    ``past`` = (keys, values) [batch, n_head, positions, head_dim], or empty."""
    return cls() if past is None else cls(tensor(past[0]), tensor(past[1]))


def run_cached(module, x: np.ndarray, cache, *args, what: str = "forward",
               empty: str = "hand k, v to the cache: k, v = cache.update(k, v)", **kwargs):
    """``module(x, cache, *args, **kwargs)`` on a numpy ``x``, then what the cache
    holds after the call, all as numpy: (output, keys, values) for one cache,
    (output, [(keys, values), ...]) for a list of them (one per block).

    A cache is changed in place (the forward returns the output alone), so it is
    read after the call; one still empty fails with the ``empty`` hint."""
    def call(x):
        out = module(x, cache, *args, **kwargs)
        caches = cache if isinstance(cache, list) else [cache]
        for i, held in enumerate(caches):
            if held.keys is None or held.values is None:
                which = f"block {i}'s cache (caches[{i}])" if isinstance(cache, list) else "the cache"
                raise CheckFailed(f"{what}: {which} is still empty after the call", empty)
        kept = [(held.keys, held.values) for held in caches]
        return (out, kept) if isinstance(cache, list) else (out, *kept[0])

    return lazily(call, tensor(x), what=what)


def numpy_tree(value, what: str):
    if isinstance(value, (tuple, list)):
        return type(value)(numpy_tree(v, f"{what}[{i}]") for i, v in enumerate(value))
    return to_numpy(value, what)


def parameter_shapes(module) -> dict[str, list[int]]:
    return {name: [int(d) for d in t.shape] for name, t in module.parameters}


def assert_parameters(learner_module, solution_module, hint: str) -> None:
    """Same parameter names and shapes as the solution's module."""
    got = parameter_shapes(learner_module)
    want = parameter_shapes(solution_module)
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(f"`{n}` {want[n]}" for n in missing))
        if extra:
            parts.append("unexpected " + ", ".join(f"`{n}` {got[n]}" for n in extra))
        raise CheckFailed("parameters: " + "; ".join(parts), hint)
    for name, shape in want.items():
        if got[name] != shape:
            raise CheckFailed(f"parameter `{name}` has shape {got[name]}, expected {shape}", hint)


def random_weights(shapes: dict[str, list[int]], seed: int = 0) -> dict[str, np.ndarray]:
    """Small random float32 weights for every parameter (norm scales near 1)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("weight") and len(shape) == 1:  # a layer norm's scale
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = 0.2 * rng.standard_normal(shape)
        weights[name] = value.astype(np.float32)
    return weights


COMPILED: list[tuple[str, float]] = []  # MAX's on-the-fly kernel compiles in this process: (kernel, seconds)
COMPILING: dict[str, float | None] = {"since": None}  # when the compile under way began (monotonic); None: none


def collect_compiles() -> bool:
    """Follow MAX's on-the-fly kernel compiles: each one's start in COMPILING and,
    once done, its time in COMPILED, instead of MAX printing a line for its first
    one. A check then reports them once, when they cost time (``compile_note``),
    and announces a wait only while a compile is under way (``slow_notice``).
    False where this MAX has no such events (model/max_internals.py): MAX's own
    line then stays, and the notice falls back to the time alone."""
    import time

    from model.max_internals import eager_policy

    policy = eager_policy()
    if policy is None:
        return False
    if getattr(policy.record_cold_compile, "collects", False):
        return True
    allowed = policy.allow_lazy_compile

    def allow_and_note() -> bool:  # asked right before a kernel that is not cached compiles
        ok = allowed()
        if ok and COMPILING["since"] is None:
            COMPILING["since"] = time.monotonic()
        return ok

    def record(key: str, seconds: float, *, provisioned: bool = False) -> None:
        COMPILED.append((key, seconds))
        COMPILING["since"] = None

    record.collects = True
    policy.allow_lazy_compile = allow_and_note
    policy.record_cold_compile = record
    return True


def compile_note(since: int = 0, threshold: float = 1.0) -> str | None:
    """One line on the compiles collected since index ``since``, when they took
    more than ``threshold`` seconds in all; None otherwise (a warm run says nothing)."""
    compiled = COMPILED[since:]
    total = sum(seconds for _, seconds in compiled)
    if total <= threshold:
        return None
    key, longest = max(compiled, key=lambda kv: kv[1])
    from tasks import task_command

    return (f"this run compiled {len(compiled)} of MAX's kernels ({total:.0f} s; the longest {key}, {longest:.0f} s); "
            f"they are cached now. `{task_command('warm')}` compiles all of them once (~20-35 min on 2 cores)")


# The small GPT-2 every model step is checked at (head_dim 12).
SMALL_CONFIG = dict(vocab_size=101, n_positions=96, n_embd=48, n_layer=2, n_head=4)
# A layer_norm_epsilon far from LayerNorm's default (1e-5): a norm that ignores the eps it is
# given (step 03) or the config's (steps 09, 10) shows in its output.
OTHER_EPS = 0.5


def paired_modules(ctx, class_name: str, seed: int, config: dict = SMALL_CONFIG):
    """(learner's module, solution's module, weights): each built from its own
    file's ``class_name`` and ``GPT2Config(**config)``, both loaded with the
    same random weights; built once per step run and config."""
    key = ("paired", class_name, tuple(sorted(config.items())))
    if key not in ctx.cache:
        solution = build(getattr(ctx.solution, class_name), ctx.solution.GPT2Config(**config))
        weights = random_weights(parameter_shapes(solution), seed=seed)
        solution.load_state_dict(weights)
        learner = build(getattr(ctx.learner, class_name), ctx.learner.GPT2Config(**config), weights=weights)
        ctx.cache[key] = learner, solution, weights
    return ctx.cache[key]


def check_same_parameters(ctx, class_name: str, hint: str, *args, config: dict = SMALL_CONFIG) -> None:
    """The learner's ``class_name`` has the solution's parameter names and shapes.

    Both are built from ``args`` or, when none are given, from their own
    file's ``GPT2Config(**config)``."""
    def make(module):
        return build(getattr(module, class_name), *(args or (module.GPT2Config(**config),)))

    assert_parameters(make(ctx.learner), make(ctx.solution), hint)


# What a first run on a machine whose kernels do not come with the project
# meets (the measured times: docs/benchmarks.md).
COLD = ("the first run on this machine compiles MAX's kernels: minutes, more on a small or busy machine "
        "(while `warm` or other work runs beside it), seconds once cached")


@contextmanager
def slow_notice(what: str, after: float = 5.0, every: float = 60.0, out=None):
    """Say, ``after`` seconds into ``what``, that it is compiling and for roughly
    how long (COLD), then every ``every`` seconds how long it has run; said only
    when MAX has compiled or is compiling a kernel during ``what`` (a warm
    machine's slow check says nothing), or, where MAX reports no compiles, on
    the time alone. A minutes-long compile is never silent."""
    import threading
    import time

    out = out or sys.stdout
    start = time.monotonic()
    done = threading.Event()
    since = len(COMPILED)
    from model.max_internals import eager_policy

    policy = eager_policy()
    followed = policy is not None and getattr(policy.record_cold_compile, "collects", False)

    def compiling() -> bool:
        return not followed or COMPILING["since"] is not None or len(COMPILED) > since

    def say() -> None:
        told = None
        while not done.wait(min(after, 0.5)):
            now = time.monotonic()
            if told is None and now - start >= after and compiling():
                print(f"  ... still running after {now - start:.0f} s ({what}): {COLD}", file=out, flush=True)
                told = now
            elif told is not None and now - told >= every:
                doing = "compiling" if not followed or COMPILING["since"] is not None else "running"
                print(f"  ... still {doing} ({what}): {now - start:.0f} s so far", file=out, flush=True)
                told = now

    thread = threading.Thread(target=say, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        COMPILING["since"] = None  # a compile that raised never reported its end: none is under way now
