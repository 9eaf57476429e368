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


@dataclass(frozen=True)
class Course:
    """The classes a build needs, from one implementation."""

    impl: str
    GPT2Config: type  # step 01
    GPT2MultiHeadAttention: type  # step 07
    ConcatCache: type  # step 07: the course's KV cache
    GPT2LMHeadModel: type  # step 11
    GPT2AttentionWithWeights: type  # bonus step 15 (the attention map)


def config_class(impl: str = "solutions") -> type:
    """Step 01's GPT2Config alone: enough to read a checkpoint and name its
    saved graph, without importing the rest of the course (and MAX's nn,
    ~0.4 s) when a saved graph will run."""
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
