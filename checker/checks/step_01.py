"""Checks for step 01: the config dataclass."""

from __future__ import annotations

import dataclasses

from checker.harness import Check, CheckFailed, StepContext

USES_MAX = False

FIELDS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "layer_norm_epsilon")

# The published sizes (OpenAI's GPT-2 release and Hugging Face's config.json files).
PUBLISHED = {
    "gpt2": (12, 12, 768),
    "gpt2-medium": (24, 16, 1024),
    "gpt2-large": (36, 20, 1280),
    "gpt2-xl": (48, 25, 1600),
}


# GPT-2 124M as Hugging Face's GPT2Config() defines it (tests/test_oracle.py
# compares this table with transformers itself; importing transformers here
# would cost seconds on every check).
HF_DEFAULTS = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "layer_norm_epsilon": 1e-5,
}


def check_fields(ctx: StepContext) -> None:
    cls = ctx.learner.GPT2Config
    if not dataclasses.is_dataclass(cls):
        raise CheckFailed("GPT2Config is not a dataclass", "keep the @dataclass(frozen=True) decorator")
    names = {f.name for f in dataclasses.fields(cls)}
    missing = [name for name in FIELDS if name not in names]
    if missing:
        raise CheckFailed(
            f"GPT2Config has no field {', '.join(missing)}",
            "use Hugging Face's names exactly, so config.json maps onto the class",
        )


def check_defaults(ctx: StepContext) -> None:
    try:
        config = ctx.learner.GPT2Config()
    except ValueError as exc:  # the learner's own validation refuses the defaults
        raise CheckFailed(
            f"GPT2Config() with your defaults raised ValueError: {exc}",
            "the defaults are the smallest GPT-2 (124M): see the table at the top of the step",
        ) from exc
    for name, expected in HF_DEFAULTS.items():
        got = getattr(config, name)
        if got != expected:
            raise CheckFailed(
                f"GPT2Config().{name} is {got!r}, expected {expected!r}",
                "the defaults are the smallest GPT-2 (124M): see the table at the top of the step",
            )


def check_head_dim(ctx: StepContext) -> None:
    for kwargs, expected in ((dict(), 64), (dict(n_embd=1600, n_head=25), 64), (dict(n_embd=48, n_head=4), 12)):
        got = ctx.learner.GPT2Config(**kwargs).head_dim
        if got != expected or not isinstance(got, int):
            raise CheckFailed(
                f"GPT2Config({', '.join(f'{k}={v}' for k, v in kwargs.items())}).head_dim is {got!r}, "
                f"expected {expected}",
                "head_dim = n_embd // n_head, an int: use // (integer division), not /",
            )


def check_sizes(ctx: StepContext) -> None:
    sizes = getattr(ctx.learner, "GPT2_SIZES", None)
    if not isinstance(sizes, dict):
        raise CheckFailed("GPT2_SIZES is missing or not a dict")
    for name, (n_layer, n_head, n_embd) in PUBLISHED.items():
        if name not in sizes:
            raise CheckFailed(f"GPT2_SIZES has no entry {name!r}", "one entry per published size")
        try:
            config = ctx.learner.GPT2Config.from_name(name)
        except ValueError as exc:
            raise CheckFailed(f"GPT2Config.from_name({name!r}) raised ValueError: {exc}",
                              "copy the sizes from the table at the top of the step") from exc
        got = (config.n_layer, config.n_head, config.n_embd)
        if got != (n_layer, n_head, n_embd):
            raise CheckFailed(
                f"{name}: (n_layer, n_head, n_embd) = {got}, expected {(n_layer, n_head, n_embd)}",
                "copy the sizes from the table at the top of the step",
            )


INVALID = [
    (dict(n_embd=100, n_head=12), "n_embd not divisible by n_head",
     "check n_embd % n_head == 0 and raise ValueError otherwise"),
    (dict(n_layer=0), "n_layer = 0", "every size must be > 0: raise ValueError for 0 or less"),
    (dict(n_head=-4), "n_head = -4", "every size must be > 0: raise ValueError for 0 or less"),
    (dict(n_head=0), "n_head = 0", "every size must be > 0: raise ValueError for 0 or less"),
    (dict(vocab_size=0), "vocab_size = 0", "every size must be > 0: raise ValueError for 0 or less"),
    (dict(n_positions=-1), "n_positions = -1", "every size must be > 0: raise ValueError for 0 or less"),
    (dict(layer_norm_epsilon=0.0), "layer_norm_epsilon = 0", "layer_norm_epsilon must be > 0"),
]


# Small but valid: a size of 1 is allowed (a 1-layer, 1-head GPT-2, a 1-token
# vocabulary or context are odd but legal), so "> 0" must not become "> 1".
VALID_SMALL = [dict(n_layer=1), dict(n_head=1, n_embd=48), dict(vocab_size=1), dict(n_positions=1),
               dict(n_embd=1, n_head=1)]


def check_validation(ctx: StepContext) -> None:
    cls = ctx.learner.GPT2Config
    cls(n_embd=48, n_head=4, n_layer=2, vocab_size=101, n_positions=96)  # valid: must not raise
    for kwargs in VALID_SMALL:
        try:
            cls(**kwargs)
        except ValueError as exc:
            raise CheckFailed(
                f"GPT2Config({', '.join(f'{k}={v}' for k, v in kwargs.items())}) raised ValueError: {exc}",
                "a size of 1 is valid (a 1-layer or 1-head GPT-2): refuse only sizes of 0 or less (value <= 0)",
            ) from exc
    for kwargs, case, hint in INVALID:
        try:
            cls(**kwargs)
        except ValueError:
            continue
        except ZeroDivisionError as exc:  # n_embd % n_head tested before n_head > 0
            raise CheckFailed(
                f"GPT2Config({', '.join(f'{k}={v}' for k, v in kwargs.items())}) raised ZeroDivisionError "
                f"({case}), expected ValueError",
                "refuse sizes of 0 or less first, then test n_embd % n_head: "
                "with n_head = 0 the remainder divides by zero") from exc
        raise CheckFailed(f"GPT2Config({', '.join(f'{k}={v}' for k, v in kwargs.items())}) was accepted ({case})", hint)


CHECKS = [
    Check("GPT2Config is a dataclass with Hugging Face's field names", check_fields,
          "declare the six fields listed in the step"),
    Check("defaults are GPT-2 124M (same as Hugging Face's GPT2Config)", check_defaults,
          "see the table at the top of the step"),
    Check("head_dim = n_embd // n_head", check_head_dim, "return n_embd // n_head"),
    Check("GPT2_SIZES and from_name give all four published sizes", check_sizes,
          "copy the sizes from the table at the top of the step"),
    Check("impossible configs raise ValueError", check_validation,
          "validate in __post_init__ and raise ValueError"),
]
