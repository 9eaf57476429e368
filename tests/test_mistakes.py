"""Seeded learner mistakes: each is a small edit of the solution, and each must
fail its step's check with the hint that names it."""

from __future__ import annotations

import pytest
from conftest import check_file, mutate

# (step, mistake, [(old, new), ...], text the failing message or hint must contain)
MISTAKES = [
    # step 01: the config
    ("01", "default width of gpt2-medium", [("n_embd: int = 768", "n_embd: int = 1024")], "with your defaults raised"),
    ("01", "default width of gpt2-xl's head count", [("n_head: int = 12", "n_head: int = 16")], "GPT2Config().n_head is 16"),
    ("01", "context of 512", [("n_positions: int = 1024", "n_positions: int = 512")], "n_positions"),
    ("01", "BERT-like eps", [("layer_norm_epsilon: float = 1e-5", "layer_norm_epsilon: float = 1e-6")], "layer_norm_epsilon"),
    ("01", "no divisibility validation",
     [("if self.n_embd % self.n_head != 0:", "if False:")], "n_embd % n_head == 0"),
    ("01", "zero sizes accepted", [("value <= 0", "value < 0")], "every size must be > 0"),
    ("01", "head_dim with true division", [("return self.n_embd // self.n_head", "return self.n_embd / self.n_head")], "use //"),
    ("01", "wrong gpt2-medium heads",
     [('"gpt2-medium": dict(n_layer=24, n_head=16', '"gpt2-medium": dict(n_layer=24, n_head=12')], "gpt2-medium"),
    # step 02: the causal mask
    ("02", "mask hides the diagonal", [("hidden = F.greater(", "hidden = F.greater_equal(")], "use >, not >="),
    ("02", "mask off by the offset", [("Tensor.arange(past_len, total,", "Tensor.arange(0, seq_len,")], "add past_len"),
    ("02", "mask inverted", [("F.where(hidden, minus_inf, zero)", "F.where(hidden, zero, minus_inf)")], "not the other way round"),
    ("02", "finite mask values", [('float("-inf")', "-1.0")], "float('-inf')"),
    ("02", "mask in float64", [("Tensor.full([], float(\"-inf\"), dtype=dtype", "Tensor.full([], float(\"-inf\"), dtype=DType.float64"),
                               ("Tensor.zeros([], dtype=dtype", "Tensor.zeros([], dtype=DType.float64")], "float32"),
    # step 03: layer norm
    ("03", "variance with Bessel's correction",
     [("var = (centered * centered).mean(axis=-1)",
       "var = (centered * centered).sum(axis=-1) / (int(x.shape[-1]) - 1)")], "Bessel"),
    ("03", "layer norm without eps", [("F.rsqrt(var + self.eps)", "F.rsqrt(var)")], "add eps = 1e-5"),
    ("03", "wrong eps value", [("eps: float = 1e-5", "eps: float = 1e-6")], "1e-5"),
    ("03", "BERT's eps value", [("eps: float = 1e-5", "eps: float = 1e-12")], "1e-12"),
    ("03", "eps outside the square root", [("F.rsqrt(var + self.eps)", "(1.0 / (F.sqrt(var) + self.eps))")], "inside the square root"),
    ("03", "bias forgotten", [("* self.weight + self.bias", "* self.weight")], "bias"),
    ("03", "scale starts at zero", [("self.weight = Tensor.ones([dim])", "self.weight = Tensor.zeros([dim])")], "weight is not all 1"),
    ("03", "parameter named as in PyTorch docs",
     [("self.bias = Tensor.zeros([dim])", "self.beta = Tensor.zeros([dim])"), ("+ self.bias", "+ self.beta")], "`bias`"),
]


@pytest.mark.parametrize("step, mistake, edits, expected", MISTAKES, ids=[m[1] for m in MISTAKES])
def test_seeded_mistake_fails_with_its_hint(step, mistake, edits, expected, tmp_path):
    outcomes = check_file(step, mutate(step, tmp_path, edits))
    failures = [o for o in outcomes if not o.passed]
    assert failures, f"{mistake}: every check passed"
    first = failures[0]
    assert expected in first.message + " " + first.hint, (
        f"{mistake}: first failure was {first.name!r}: {first.message} / hint: {first.hint}"
    )
