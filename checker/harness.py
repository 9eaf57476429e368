"""The machinery every step check shares: load the learner's file, run named
checks, turn learner exceptions into one readable message, compare numbers.

A check is a function that returns nothing when the learner's code is right
and raises ``CheckFailed(message, hint)`` when it is not. Any other exception
escaping a check came from the learner's code (or is a bug in the check); it is
reported with the last frame that lies in the learner's file, never as a wall
of MAX traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import linecache
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np

from checker.skeleton import ROOT, TODO_MARK
from model import max_internals as mi
from tasks import task_command  # the command as the learner runs tasks (pixi or tasks.py)

# fp32 tolerance: the learner's graph and the solution's may order reductions
# differently, which moves results by ~1e-6; real mistakes move them by far more.
RTOL = 1e-4
ATOL = 1e-4


# Each check's time limit, in seconds: generous, since a first check on a new machine may
# compile MAX's kernels for minutes; ``python -m checker --time-limit`` changes it.
TIME_LIMIT = 900


class TimeLimitReached(BaseException):
    """A check ran past its time limit (a BaseException: learner code that catches
    Exception does not swallow it)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


@contextmanager
def time_limit(seconds: float | None):
    """Raise TimeLimitReached in the block after ``seconds`` (None: no limit).
    Python code is interrupted between two of its lines; a call into MAX's
    native code, when it returns. Only the main thread can be interrupted:
    elsewhere the block runs unlimited."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeLimitReached(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class CheckFailed(Exception):
    """The learner's code ran but gave a wrong answer."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass
class Check:
    name: str
    run: Callable[["StepContext"], None]
    hint: str  # shown when the check fails and names no more precise hint


@dataclass
class Outcome:
    name: str
    passed: bool
    seconds: float
    message: str = ""
    hint: str = ""


@dataclass
class StepContext:
    """What a check gets: the learner's module and the reference solution's."""

    step: str
    learner_path: Path
    learner: ModuleType
    solution: ModuleType
    cache: dict = field(default_factory=dict)  # checks may share built objects

    def call(self, fn: Callable, *args, what: str = "", **kwargs):
        """Call learner code; a None result is a failure with its own message."""
        result = fn(*args, **kwargs)
        if result is None:
            name = what or getattr(fn, "__qualname__", repr(fn))
            raise CheckFailed(
                f"{name} returned None",
                "a function (or forward) must end with `return <result>`",
            )
        return result


# ----------------------------------------------------------------------------
# Loading


def load_file(path: Path, module_name: str | None = None) -> ModuleType:
    """Import a Python file. Files inside steps/ or solutions/ are imported by
    their package name so that later steps importing them share one module."""
    path = path.resolve()
    for package in ("steps", "solutions"):
        if path.parent == ROOT / package:
            name = f"{package}.{path.stem}"
            if name in sys.modules:
                return importlib.reload(sys.modules[name])
            return importlib.import_module(name)
    name = module_name or f"_checked_{path.stem}_{abs(hash(str(path)))}_{time.monotonic_ns()}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while building
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


# ----------------------------------------------------------------------------
# Reporting learner exceptions


def describe_exception(exc: BaseException, learner_path: Path) -> tuple[str, str]:
    """A one-paragraph message and a hint for an exception from learner code.

    The frame shown is the last one in the learner's file or, when the error
    came from an earlier step the file imports (steps/step_NN.py), that one."""
    learner_path = learner_path.resolve()
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve() == learner_path:
        return f"{learner_path.name}:{exc.lineno}: SyntaxError: {exc.msg}", "fix the syntax on that line"
    frames = traceback.extract_tb(exc.__traceback__)
    learner_files = {learner_path}
    ours = [f for f in frames if Path(f.filename).resolve() in learner_files or _in_steps(f.filename)]
    where, hint = "", "read the line above: that is where your code failed"
    if ours:
        frame = ours[-1]
        code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        where = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}: `{code}`\n"
        if Path(frame.filename).resolve() != learner_path:
            earlier = Path(frame.filename).stem.removeprefix("step_")
            hint = f"this step runs your step {earlier}: finish it first ({task_command('s' + earlier)})"
    else:
        hint = "the error did not pass through your file; check the names and signatures the step asks for"
    if isinstance(exc, SystemExit):
        return (f"{where}your code ended the program (SystemExit({exc.code!r})): the checker runs it as a module",
                "remove the sys.exit / exit() / raise SystemExit: a step's code returns its result")
    if isinstance(exc, TimeLimitReached):
        return (f"{where}did not finish within {exc.seconds:g} s, the time limit of each check",
                "an endless loop? (a first check on a new machine may compile MAX's kernels for minutes: "
                "`python -m checker NN --time-limit SECONDS` gives it longer)")
    if isinstance(exc, NotImplementedError) and TODO_MARK in str(exc):
        if ours and Path(ours[-1].filename).resolve() == learner_path:
            hint = "replace the `raise NotImplementedError(...)` line with your code"
        return f"{where}this part is still a TODO", hint
    text = str(exc)
    if isinstance(exc, OverflowError) and "infinity to integer" in text:
        hint = ("MAX turned float('-inf') into an integer: with plain Python numbers on both sides (as in "
                "F.where(cond, float('-inf'), 0.0)) it picks an integer dtype. Make at least one a float32 tensor: "
                "Tensor.full([], float('-inf'), dtype=dtype, device=device)")
    if mi.OP_FAILED in text and mi.DIAGNOSTICS in text:
        hint = _mask_width_hint(text, learner_path) or _shape_hint(text, hint)
        return f"{where}{type(exc).__name__}: {_graph_op_error(text)}", hint
    return f"{where}{type(exc).__name__}: {_first_lines(text)}", hint


def _graph_op_error(text: str) -> str:
    """MAX's "Failed to create op" message, kept whole where it matters: the
    op, every input's dtype and shape, and the reason after "Diagnostics:"
    (which comes last, so cutting the message at a few lines loses it)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    op = lines[0]
    inputs = [f"{m[1]}: {m[2]} [{mi.DIM.sub(r'\1', m[3])}] on {m[4]}"
              for m in map(mi.OP_INPUT.search, lines) if m]
    at = next(i for i, line in enumerate(lines) if line.startswith(mi.DIAGNOSTICS))
    reason = next((line for line in lines[at + 1:] if not line.startswith(mi.INFER_FAILED)), "")
    return "\n".join([op, *("  " + i for i in inputs), "  why: " + reason])


def _mask_width_hint(text: str, learner_path: Path) -> str | None:
    """The scores [.., seq, keys] + a mask [seq, fewer keys]: a causal mask
    built for the new tokens alone, without the cached ones (past_len not
    passed). MAX fails at the add; the mistake is where the mask was made, so
    the hint names that line of the learner's file."""
    if mi.ADD_OP not in text:
        return None
    shapes = [[d.strip() for d in m.split(",")] for m in mi.SHAPE.findall(text)]
    shapes = [[mi.DIM.sub(r"\1", d) for d in shape] for shape in shapes]
    scores = next((sh for sh in shapes if len(sh) == 4), None)
    mask = next((sh for sh in shapes if len(sh) == 2), None)
    if scores is None or mask is None or mask[0] != scores[2] or mask[1] == scores[3]:
        return None
    made = [(n, line.strip()) for n, line in enumerate(learner_path.read_text().splitlines(), 1)
            if "causal_mask(" in line and not line.lstrip().startswith(("#", "def "))]
    where = "; ".join(f"{learner_path.name}:{n}: `{code}`" for n, code in made) or "where you build it"
    return (f"the scores have {scores[3]} keys (the cached ones and the new) but the mask is [{mask[0]}, {mask[1]}]: "
            f"build the mask for every key, causal_mask(seq_len, past_len) with past_len = k.shape[2] - seq_len, "
            f"the keys before the new rows. The mask is made at {where}")


def _shape_hint(text: str, default: str) -> str:
    if any(pattern in text for pattern in mi.DTYPE_MISMATCH):
        return ("the op's inputs have different dtypes (the `why` line names them): a length taken from a shape, "
                "such as x.shape[-1], is an int64 dimension; make it a Python number first (int(x.shape[-1])) "
                "before it meets a float tensor, or cast a tensor with t.cast(DType.float32)")
    if mi.MATMUL_OP in text and _heads_into_linear(text):
        return ("a Linear layer got [batch, n_head, seq, head_dim]: merge the heads first "
                "(_merge_heads gives [batch, seq, n_embd]), then c_proj")
    if mi.MATMUL_OP in text or "matmul" in text.lower():
        return ("a matmul's shapes disagree: the last axis of the left must equal the second-to-last of the right "
                "([.., n, k] @ [.., k, m]); for attention scores transpose the keys, q @ k.transpose(-1, -2)")
    if "shape" in text.lower() or "dimension" in text.lower():
        return ("MAX checks shapes as it builds each op: the inputs above are what that op got, `why` says which "
                "dimensions disagree; print(t.shape) before that line to see where they went wrong")
    return default


def _heads_into_linear(text: str) -> bool:
    """A matmul of x [b, h, t, d] with a square weight [h*d, h*d]: c_proj
    given the heads as they came out of attention, not merged."""
    inputs = [m for m in map(mi.OP_INPUT.search, text.splitlines()) if m]
    shapes = [[mi.DIM.sub(r"\1", d.strip()) for d in m[3].split(",")] for m in inputs]
    if [len(shape) for shape in shapes] != [4, 2] or not all(d.isdigit() for shape in shapes for d in shape):
        return False
    (_, heads, _, width), (rows, cols) = ([int(d) for d in shape] for shape in shapes)
    return rows == cols == heads * width


def _in_steps(filename: str) -> bool:
    return Path(filename).resolve().parent == ROOT / "steps"


def _first_lines(text: str, limit: int = 3, width: int = 300) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()][:limit]
    joined = "\n".join(lines)
    return joined if len(joined) <= width else joined[: width - 3] + "..."


# ----------------------------------------------------------------------------
# Running


# What learner code can raise that fails a check (a SystemExit from sys.exit included), never ending the checker.
LEARNER_ERRORS = (Exception, SystemExit, TimeLimitReached)


def run_checks(
    step: str, checks: list[Check], learner_path: Path, solution_path: Path, *, stop_at_failure: bool = False,
    seconds: float | None = TIME_LIMIT,
) -> list[Outcome]:
    """Load both files and run the checks (all of them, or up to the first
    failure), each within ``seconds`` (None: no limit); never raises for
    learner errors."""
    start = time.perf_counter()
    solution = load_file(solution_path)
    try:
        with time_limit(seconds):
            learner = load_file(learner_path)
    except LEARNER_ERRORS as exc:  # the learner's file does not even import
        message, hint = describe_exception(exc, learner_path)
        return [Outcome("your file imports", False, time.perf_counter() - start, message, hint)]
    context = StepContext(step, learner_path, learner, solution)
    outcomes = []
    for check in checks:
        t0 = time.perf_counter()
        try:
            with time_limit(seconds):
                check.run(context)
        except CheckFailed as failure:
            outcomes.append(
                Outcome(check.name, False, time.perf_counter() - t0, failure.message, failure.hint or check.hint)
            )
        except LEARNER_ERRORS as exc:
            message, hint = describe_exception(exc, learner_path)
            outcomes.append(Outcome(check.name, False, time.perf_counter() - t0, message, hint))
        else:
            outcomes.append(Outcome(check.name, True, time.perf_counter() - t0))
        if stop_at_failure and not outcomes[-1].passed:
            break
    return outcomes


# ----------------------------------------------------------------------------
# Numbers


def assert_close(actual, expected: np.ndarray, what: str, hint: str | None = None) -> None:
    """Shape, dtype and values of ``actual`` must match ``expected`` (fp32 tolerance)."""
    actual = to_numpy(actual, what)
    if actual.shape != expected.shape:
        raise CheckFailed(
            f"{what}: shape {list(actual.shape)}, expected {list(expected.shape)}",
            hint or "compare the shapes step by step: print(t.shape) after each line",
        )
    if actual.dtype != expected.dtype:
        raise CheckFailed(f"{what}: dtype {actual.dtype}, expected {expected.dtype}", hint)
    if not close(actual, expected):
        raise CheckFailed(f"{what}: {mismatch(actual, expected)}", hint)


def close(actual: np.ndarray, expected: np.ndarray) -> bool:
    return actual.shape == expected.shape and bool(
        np.allclose(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    )


def largest_difference(actual: np.ndarray, expected: np.ndarray) -> tuple[float, tuple[int, ...]]:
    """The largest |actual - expected| (same shapes) and where: equal infinities
    and both-NaN count as 0, a NaN or infinity against anything else as inf."""
    with np.errstate(invalid="ignore"):
        diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    diff = np.where(np.isnan(diff) & ~(np.isnan(actual) & np.isnan(expected)), np.inf, diff)
    diff = np.where(np.isnan(diff), 0, diff)  # both NaN: equal
    diff = np.where(np.isinf(actual) & np.isinf(expected) & (np.sign(actual) == np.sign(expected)), 0, diff)
    index = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    return float(diff[index]), index


def mismatch(actual: np.ndarray, expected: np.ndarray) -> str:
    worst, index = largest_difference(actual, expected)
    return (
        f"values differ (largest difference {worst:.3g} at index {list(index)}: "
        f"got {actual[index]:.6g}, expected {expected[index]:.6g})"
    )


def to_numpy(value, what: str) -> np.ndarray:
    """A MAX tensor (or anything array-like) as a numpy array, or CheckFailed."""
    if value is None:
        raise CheckFailed(f"{what} returned None", "a function (or forward) must end with `return <result>`")
    if isinstance(value, np.ndarray):
        return value
    to_np = getattr(value, "to_numpy", None)
    if to_np is None:
        raise CheckFailed(f"{what}: got a {type(value).__name__}, expected a Tensor")
    return to_np()


def diagnose(actual: np.ndarray, mistakes: dict[str, np.ndarray]) -> str | None:
    """The hint of the first known mistake whose output ``actual`` matches."""
    for hint, wrong in mistakes.items():
        if close(actual, wrong):
            return hint
    return None


def compare(actual, expected: np.ndarray, what: str, hint: str,
            mistakes: Callable[[], dict[str, np.ndarray]] | None = None) -> None:
    """Like ``assert_close``, but a wrong answer that equals a known mistake's
    output (``mistakes()`` maps hint -> that output) fails with that hint."""
    actual = to_numpy(actual, what)
    if mistakes is not None and actual.shape == expected.shape and not close(actual, expected):
        known = diagnose(actual, mistakes())
        if known:
            raise CheckFailed(f"{what}: wrong values", known)
    assert_close(actual, expected, what, hint)
