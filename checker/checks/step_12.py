"""Checks for step 12: sampling and the generation loop."""

from __future__ import annotations

import numpy as np

from checker import maxrun, oracle
from checker.harness import Check, CheckFailed, StepContext

USES_MAX = True
CONFIG = maxrun.SMALL_CONFIG


def _softmax(x):
    return oracle.softmax(np.asarray(x, dtype=np.float64))


def check_greedy(ctx: StepContext) -> None:
    rng = np.random.default_rng(12)
    for _ in range(20):
        logits = rng.standard_normal(50).astype(np.float32)
        got = ctx.call(ctx.learner.sample_next_token, logits, 0.0, np.random.default_rng(0), what="sample_next_token")
        if got == int(np.argmin(logits)):
            raise CheckFailed("temperature 0 picked the lowest logit", "greedy takes the argmax (highest score)")
        if got != int(np.argmax(logits)):
            raise CheckFailed(f"temperature 0 picked token {got}, expected argmax {int(np.argmax(logits))}",
                              "temperature 0 means greedy: np.argmax(logits)")


def check_sampling(ctx: StepContext) -> None:
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0], dtype=np.float32)
    draws = 6000
    for temperature in (0.5, 1.0, 2.0):
        rng = np.random.default_rng(1)
        counts = np.bincount(
            [ctx.learner.sample_next_token(logits, temperature, rng) for _ in range(draws)], minlength=len(logits)
        )
        freq = counts[: len(logits)] / draws
        # 6000 draws: a frequency's standard error is below 0.007; 0.03 is > 4 of them.
        if np.abs(freq - _softmax(logits / temperature)).max() < 0.03:
            continue
        hints = {
            "divide the logits by the temperature (you multiplied)": _softmax(logits * temperature),
            "divide the logits by the temperature before the softmax": _softmax(logits),
            "apply the temperature to the logits, before softmax, not to the probabilities":
                _softmax(logits) ** (1 / temperature) / (_softmax(logits) ** (1 / temperature)).sum(),
        }
        for hint, probs in hints.items():
            if np.abs(freq - probs).max() < 0.03:
                raise CheckFailed(f"at temperature {temperature} the tokens come out with the wrong frequencies", hint)
        raise CheckFailed(
            f"at temperature {temperature}: frequencies {np.round(freq, 3).tolist()}, expected "
            f"{np.round(_softmax(logits / temperature), 3).tolist()}",
            "p = softmax(logits / temperature); sample with rng.choice(len(p), p=p)",
        )


def check_large_logits(ctx: StepContext) -> None:
    # Real logits can be large; exp(1000) overflows to inf unless the max is
    # subtracted first (softmax is unchanged by a shift).
    logits = np.array([1000.0, 999.0, 990.0], dtype=np.float32)
    rng = np.random.default_rng(3)
    with np.errstate(all="ignore"):
        try:
            draws = [ctx.learner.sample_next_token(logits, 1.0, rng) for _ in range(2000)]
        except ValueError as exc:  # rng.choice refuses NaN probabilities
            raise CheckFailed(f"logits near 1000 broke sampling ({str(exc).splitlines()[0]})",
                              "exp(1000) overflows to inf: subtract the largest logit first, "
                              "p = exp(x - x.max()) / sum(...) (softmax is unchanged by the shift)") from None
    freq = np.bincount(draws, minlength=3)[:3] / len(draws)
    if np.abs(freq - _softmax(logits)).max() > 0.04:
        raise CheckFailed(f"logits [1000, 999, 990]: frequencies {np.round(freq, 3).tolist()}, expected "
                          f"{np.round(_softmax(logits), 3).tolist()}",
                          "subtract the largest logit before exp, p = exp(x - x.max()) / sum(...): "
                          "the shift leaves softmax unchanged and keeps exp finite")


def _toy_next_logits(calls: list):
    """A tiny deterministic 'model': favours (last id * 7 + len) % 11."""
    def next_logits(ids: list[int]) -> np.ndarray:
        calls.append(list(ids))
        logits = np.zeros(11, dtype=np.float32)
        logits[(ids[-1] * 7 + len(ids)) % 11] = 5.0
        return logits
    return next_logits


def check_loop(ctx: StepContext) -> None:
    calls: list = []
    got = ctx.call(ctx.learner.generate, _toy_next_logits(calls), [3, 1], 5, what="generate")
    expected, ids = [], [3, 1]
    for _ in range(5):
        ids.append((ids[-1] * 7 + len(ids)) % 11)
        expected.append(ids[-1])
    if list(got) != expected:
        hint = "feed each new token back in: call next_logits(prompt + generated so far)"
        if list(got) == [3, 1] + expected:
            hint = "return only the new tokens, not the prompt in front of them"
        elif len(got) != 5:
            hint = "generate exactly max_new_tokens tokens and return only the new ones"
        raise CheckFailed(f"generate gave {list(got)}, expected {expected}", hint)
    if calls[0] != [3, 1] or calls[-1] != ids[:-1]:
        raise CheckFailed("next_logits was not called with the growing sequence",
                          "call next_logits(prompt + generated so far)")
    stop = ctx.learner.generate(_toy_next_logits([]), [3, 1], 5, eos_token=expected[1])
    if list(stop) != expected[:2]:
        raise CheckFailed(f"with eos_token={expected[1]} generate gave {list(stop)}, expected {expected[:2]}",
                          "stop right after producing eos_token (and keep it)")


def check_seed(ctx: StepContext) -> None:
    def noisy(ids):
        return np.sin(np.arange(30) * (len(ids) + 1)).astype(np.float32)

    first = ctx.learner.generate(noisy, [1], 20, temperature=1.0, seed=7)
    again = ctx.learner.generate(noisy, [1], 20, temperature=1.0, seed=7)
    other = ctx.learner.generate(noisy, [1], 20, temperature=1.0, seed=8)
    if list(first) != list(again):
        raise CheckFailed("the same seed gave different text", "sample only with the rng made from `seed`")
    if list(first) == list(other):
        raise CheckFailed("seeds 7 and 8 gave the same 20 tokens", "pass the rng on to sample_next_token")


def check_gpt2(ctx: StepContext) -> None:
    # Greedy text from the real (small, random) GPT-2 of step 11 equals the
    # numpy oracle's greedy continuation, token for token.
    from solutions.solution_01 import GPT2Config
    from solutions.solution_11 import GPT2LMHeadModel

    model = maxrun.build(GPT2LMHeadModel, GPT2Config(**CONFIG))
    weights = maxrun.random_weights(maxrun.parameter_shapes(model), seed=12)
    model.load_state_dict(weights)

    def next_logits(ids: list[int]) -> np.ndarray:
        last = maxrun.tensor(np.array([len(ids) - 1], dtype=np.int64))
        logits = maxrun.lazily(model, maxrun.tensor(np.array([ids], dtype=np.int64)), None, last)
        return logits[0, -1]

    prompt = [5, 17, 42]
    got = ctx.learner.generate(next_logits, prompt, 8)
    expected = oracle.greedy(prompt, weights, CONFIG["n_head"], 8)
    if list(got) != expected:
        raise CheckFailed(f"greedy continuation {list(got)}, expected {expected}",
                          "temperature 0: argmax of the last position's logits, fed back in")


CHECKS = [
    Check("temperature 0 is greedy (argmax)", check_greedy, "np.argmax(logits)"),
    Check("temperature 0.5, 1, 2 sample from softmax(logits / T)", check_sampling,
          "p = softmax(logits / temperature); rng.choice(len(p), p=p)"),
    Check("large logits (near 1000) sample without overflow", check_large_logits,
          "softmax with the max subtracted: exp(x - x.max())"),
    Check("the loop feeds tokens back, stops at max_new_tokens and eos", check_loop,
          "append each token and call next_logits again"),
    Check("a seed reproduces the same text", check_seed, "use only the rng made from the seed"),
    Check("greedy text from a small GPT-2 equals the numpy oracle's", check_gpt2,
          "temperature 0: argmax of the last position's logits"),
]
