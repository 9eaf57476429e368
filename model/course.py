"""Which code the model is built from: the reference solutions or the learner's steps/.

This is the one place the app reaches into the course, through plain imports
(so any import reader sees the arrows model -> solutions and model -> steps).
``steps/`` holds the learner's own files; they import each other
(``steps.step_11`` imports ``steps.step_10``, ...), so ``--impl steps`` runs
the learner's code all the way down.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

IMPLS = ("solutions", "steps")
# The steps a model build runs (config, mask, attention, the LM head and what they import).
MODEL_STEPS = ("01", "02", "07", "11")
_TODO = re.compile(r"""^[ \t]*raise NotImplementedError\(\s*["']TODO\(step (\d+)\)""", re.M)
_IMPORT = re.compile(r"^from steps\.step_(\d+) import", re.M)
# A learner's file that imports a solution (a solution copied into steps/ to move on)
# runs the reference's code for that step, and everything the solution imports.
_SOLUTION_IMPORT = re.compile(r"^\s*(?:from|import) solutions\.solution_(\d+)", re.M)
SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"


def steps_folder() -> Path:
    """The folder ``import steps`` reads: the learner's, wherever Python finds it."""
    import importlib.util

    spec = importlib.util.find_spec("steps")
    if spec is None or not spec.submodule_search_locations:
        return Path(__file__).resolve().parent.parent / "steps"
    return Path(list(spec.submodule_search_locations)[0])


def imported_steps(path: Path) -> list[str]:
    """The learner's step files that the file at ``path`` imports itself (``from steps.step_NN import``)."""
    return sorted(set(_IMPORT.findall(path.read_text())))


def steps_needed(*roots: str, folder: Path | None = None) -> list[str]:
    """The learner's step files that ``roots`` import, directly or not, roots included, in order."""
    folder = folder or steps_folder()
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        step = todo.pop()
        if step in seen:
            continue
        seen.add(step)
        path = folder / f"step_{step}.py"
        todo += _IMPORT.findall(path.read_text()) if path.is_file() else []
    return sorted(seen)


def unfinished_steps(*roots: str, folder: Path | None = None) -> list[tuple[str, int]]:
    """(step, line of its first TODO) for every step file ``roots`` need that still
    raises a TODO, in order: so ``--impl steps`` names them all at once, not one
    failure a run."""
    folder = folder or steps_folder()
    out = []
    for step in steps_needed(*roots, folder=folder):
        path = folder / f"step_{step}.py"
        text = path.read_text() if path.is_file() else ""
        found = _TODO.search(text)
        if found:
            out.append((step, text.count("\n", 0, found.start()) + 1))
    return out


def unfinished_message(unfinished: list[tuple[str, int]], roots: tuple[str, ...] = MODEL_STEPS) -> str:
    """One line naming every unfinished step a build needs, and how to check each."""
    needed = ", ".join(steps_needed(*roots))
    files = ", ".join(f"steps/step_{step}.py (line {line})" for step, line in unfinished)
    from tasks import task_command

    checks = ", ".join(f"`{task_command('s' + step)}`" for step, _ in unfinished)
    if len(unfinished) == 1:
        return (f"--impl steps builds GPT-2 from your steps {needed}; one still has a TODO: {files}. "
                f"Finish it and check it: {checks}")
    return (f"--impl steps builds GPT-2 from your steps {needed}; {len(unfinished)} still have TODOs: {files}. "
            f"Finish them in this order and check each: {checks}")


def reference_steps(*roots: str, folder: Path | None = None) -> tuple[list[str], list[str]]:
    """(the learner's files among ``roots``' steps that import a solution, the
    solutions' steps those imports run, directly or not), each in order."""
    folder = folder or steps_folder()
    copied, todo = [], []
    for step in steps_needed(*roots, folder=folder):
        path = folder / f"step_{step}.py"
        found = _SOLUTION_IMPORT.findall(path.read_text()) if path.is_file() else []
        if found:
            copied.append(step)
            todo += found
    seen: set[str] = set()
    while todo:
        step = todo.pop()
        if step not in seen:
            seen.add(step)
            todo += _IMPORT.findall((SOLUTIONS / f"solution_{step}.py").read_text().replace("solutions.solution_",
                                                                                          "steps.step_"))
    return copied, sorted(seen)


# What the checker last found for a step of the learner's: kept by the file's
# contents and those of the steps it imports, so an edit anywhere in them
# makes it unknown again. The app reads it to name a step that fails its check.
CHECKS = "checks"


def _check_key(step: str, folder: Path) -> str:
    from artifacts.files import files_digest

    paths = [folder / f"step_{needed}.py" for needed in steps_needed(step, folder=folder)]
    present = [p for p in paths if p.is_file()]  # a missing step counts by its name's absence
    return f"step_{step}-{files_digest(present, folder)[:24]}"


def record_check(step: str, folder: Path, passed: bool) -> None:
    """Keep the checker's verdict on the learner's step ``step`` in ``folder`` as its files are now."""
    from artifacts import atomic
    from model import caches

    with atomic.writing(caches.folder(CHECKS) / _check_key(step, folder)) as staged:
        if staged is not None:
            staged.write_text("passed" if passed else "failed")


def last_check(step: str, folder: Path | None = None) -> bool | None:
    """The checker's verdict on ``step`` as its files are now: True, False, or None when not checked so."""
    from model import caches

    try:
        said = (caches.folder(CHECKS) / _check_key(step, folder or steps_folder())).read_text().strip()
    except OSError:
        return None
    return {"passed": True, "failed": False}.get(said)


# What of the learner's step 07 runs where. The app keeps each layer's keys and values in
# buffers allocated once (model/kv_cache.py); the server in the engine's pages, attended by
# its flash-attention kernel, which alone knows where each request of a batch starts
# (serve/network.py). Step 07's text says the same.
STEP_07_RUNS = {
    "app": "of step 07 your forward, _attn and ConcatCache.attend run, the app's in-place cache in place of "
           "your update and length",
    "server": "of step 07 your forward runs (c_attn, the heads, c_proj), the engine's paged cache and flash "
              "attention in place of your ConcatCache and _attn",
}


@dataclass(frozen=True)
class Whose:
    """Whose code a ``--impl steps`` build runs, step by step."""

    mine: list[str]  # the learner's step files that run
    copied: list[str]  # those of them that import the solutions
    reference: list[str]  # the solutions' steps that run, through those imports
    failing: list[str]  # the learner's steps whose check failed, as they are now
    unchecked: list[str]  # the learner's steps not checked as they are now

    def code(self) -> str:
        """"your steps 01-06, 10, 11 and the reference's 07-09"."""
        text = f"your steps {spans(self.mine)}"
        return text + (f" and the reference's {spans(self.reference)}" if self.reference else "")

    def built(self, where: str) -> str:
        """"built from ...", and what of step 07 runs there (``where``: "app" or "server")."""
        own_07 = "07" in self.mine and "07" not in self.reference
        return f"built from {self.code()}" + (f"; {STEP_07_RUNS[where]}" if own_07 else "")

    def warning(self) -> str | None:
        """One line on what is not the learner's own checked code, or None."""
        from tasks import task_command

        said = []
        if self.copied:
            said.append(f"your {_steps(self.copied)} {_verb(self.copied, 'imports', 'import')} solutions/ "
                        f"(import steps.step_NN there to run yours)")
        if self.failing:
            said.append(f"{_steps(self.failing)} {_verb(self.failing, 'fails its', 'fail their')} check "
                        f"({', '.join(f'`{task_command("s" + n)}`' for n in self.failing)})")
        if self.unchecked:
            said.append(f"{_steps(self.unchecked)} {_verb(self.unchecked, 'is', 'are')} not checked as "
                        f"{_verb(self.unchecked, 'it is', 'they are')} now (`{task_command('sNN')}`)")
        return f"--impl steps runs {self.code()}: " + "; ".join(said) if said else None


def whose(*roots: str, folder: Path | None = None) -> Whose:
    """Whose code a build of ``roots`` runs from the learner's ``folder``."""
    folder = folder or steps_folder()
    mine = steps_needed(*roots, folder=folder)
    copied, reference = reference_steps(*roots, folder=folder)
    verdicts = {step: last_check(step, folder) for step in mine}
    return Whose(mine, copied, reference, [s for s, v in verdicts.items() if v is False],
                 [s for s, v in verdicts.items() if v is None])


def spans(steps: list[str]) -> str:
    """"01-06, 10, 11": three or more steps in a row as a range."""
    runs: list[list[str]] = []
    for step in steps:
        if runs and int(step) == int(runs[-1][-1]) + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(r) for r in runs)


def _steps(steps: list[str]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {spans(steps)}"


def _verb(steps: list[str], one: str, more: str) -> str:
    return one if len(steps) == 1 else more


@dataclass(frozen=True)
class Course:
    """The classes a build needs, from one implementation."""

    impl: str
    GPT2Config: type  # step 01
    GPT2MultiHeadAttention: type  # step 07
    ConcatCache: type  # step 07: the course's KV cache
    GPT2LMHeadModel: type  # step 11
    GPT2AttentionWithWeights: type  # bonus step 15 (the attention map)


def import_steps_quietly() -> None:
    """Import the learner's steps package without its notes: on import it
    names each import of solutions.* in a step file, a line each, which
    whose()'s one line (printed first) has already said."""
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        import steps  # noqa: F401


def config_class(impl: str = "solutions") -> type:
    """Step 01's GPT2Config alone: enough to read a checkpoint and name its
    saved graph, without importing the rest of the course (and MAX's nn, a
    noticeable part of a start) when a saved graph will run."""
    if impl == "solutions":
        from solutions.solution_01 import GPT2Config
    elif impl == "steps":
        from steps.step_01 import GPT2Config
    else:
        raise ValueError(f"impl must be one of {IMPLS}, not {impl!r}")
    return GPT2Config


def course(impl: str = "solutions") -> Course:
    GPT2Config = config_class(impl)  # refuses an unknown impl
    if impl == "solutions":
        from solutions.solution_07 import ConcatCache, GPT2MultiHeadAttention
        from solutions.solution_11 import GPT2LMHeadModel
        from solutions.solution_15 import GPT2AttentionWithWeights
    else:
        from steps.step_07 import ConcatCache, GPT2MultiHeadAttention
        from steps.step_11 import GPT2LMHeadModel
        from steps.step_15 import GPT2AttentionWithWeights
    return Course(impl, GPT2Config, GPT2MultiHeadAttention, ConcatCache, GPT2LMHeadModel, GPT2AttentionWithWeights)
