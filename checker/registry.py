"""The course's steps, in one table: what the checker, ``show``, ``test-all`` and the
book read, and what pixi.toml's tasks and the README's tables are tested against.

Adding a step is ``solutions/solution_NN.py`` (its skeleton is generated from it:
``pixi run skeletons``), ``checker/checks/step_NN.py`` (``USES_MAX`` and ``CHECKS``)
and one row here; ``show`` finds ``show_NN`` in checker/show.py and the book a
``step_NN`` in checker/pictures.py when the row names a picture
(docs/contributing.md has the whole recipe).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Step:
    number: str  # two digits, as in steps/step_NN.py
    title: str
    bonus: bool = False  # optional: not counted by test-all's verdict
    picture: str = ""  # what show and the book call the solution's matrix; "" when it has none

    @property
    def task(self) -> str:
        """The pixi task that checks it."""
        return f"s{self.number}"

    @property
    def description(self) -> str:
        """The task's description in pixi.toml."""
        return f"{'Bonus step' if self.bonus else 'Check step'} {self.number}: {self.title}"

    @property
    def heading(self) -> str:
        """How the checker and the book's navigation name it."""
        return f"{'Bonus step' if self.bonus else 'Step'} {self.number}"

    @property
    def solution(self) -> Path:
        return ROOT / "solutions" / f"solution_{self.number}.py"

    @property
    def skeleton(self) -> Path:
        return ROOT / "steps" / f"step_{self.number}.py"

    def checks(self):
        """Its checks module (``USES_MAX``, ``CHECKS``)."""
        return importlib.import_module(f"checker.checks.step_{self.number}")


ATTENTION_WEIGHTS = "head 0's attention weights (rows: queries)"

STEPS: tuple[Step, ...] = (
    Step("01", "the GPT-2 config"),
    Step("02", "the causal mask", picture="mask (0 visible, -inf hidden)"),
    Step("03", "layer normalization"),
    Step("04", "the MLP (GPT2MLP)"),
    Step("05", "token embeddings", picture="one row per id"),
    Step("06", "position embeddings", picture="rows 2..6 of the table"),
    Step("07", "multi-head attention", picture=ATTENTION_WEIGHTS),
    Step("08", "residual connections and pre-layer-norm"),
    Step("09", "the transformer block"),
    Step("10", "the stacked model"),
    Step("11", "the language-model head", picture="logits: one row per position, one column per token id"),
    Step("12", "text generation"),
    # Bonus steps (optional): attention as other courses write it.
    Step("13", "multi-head attention in numpy", bonus=True),
    Step("14", "the post-LN attention block", bonus=True),
    Step("15", "attention weights", bonus=True, picture=ATTENTION_WEIGHTS),
    Step("16", "rotary causal attention", bonus=True),
)


def by_number() -> dict[str, Step]:
    """Every step by its two digits (read at call time, so a test may add a row)."""
    return {step.number: step for step in STEPS}


def find(number: str) -> Step | None:
    """The step ``number`` names ("7" or "07"), or None."""
    return by_number().get(number.zfill(2))


def numbers() -> str:
    """The range of steps, for messages: "01-12, bonus 13-16"."""
    core = [s.number for s in STEPS if not s.bonus]
    bonus = [s.number for s in STEPS if s.bonus]
    return f"{core[0]}-{core[-1]}" + (f", bonus {bonus[0]}-{bonus[-1]}" if bonus else "")
