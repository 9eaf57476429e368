"""Which code the model is built from: the reference solutions or the learner's steps/.

This is the one place the app reaches into the course, through plain imports
(so any import reader sees the arrows model -> solutions and model -> steps).
``steps/`` holds the learner's own files; they import each other
(``steps.step_11`` imports ``steps.step_10``, ...), so ``--impl steps`` runs
the learner's code all the way down.
"""

from __future__ import annotations

from dataclasses import dataclass

IMPLS = ("solutions", "steps")


@dataclass(frozen=True)
class Course:
    """The classes a build needs, from one implementation."""

    impl: str
    GPT2Config: type  # step 01
    causal_mask: object  # step 02
    GPT2MultiHeadAttention: type  # step 07
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
        from solutions.solution_02 import causal_mask
        from solutions.solution_07 import GPT2MultiHeadAttention
        from solutions.solution_11 import GPT2LMHeadModel
        from solutions.solution_15 import GPT2AttentionWithWeights
    else:
        from steps.step_02 import causal_mask
        from steps.step_07 import GPT2MultiHeadAttention
        from steps.step_11 import GPT2LMHeadModel
        from steps.step_15 import GPT2AttentionWithWeights
    return Course(impl, GPT2Config, causal_mask, GPT2MultiHeadAttention, GPT2LMHeadModel, GPT2AttentionWithWeights)
