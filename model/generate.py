"""Generation with the KV cache: prefill the prompt once, then one token per step.

Prompts are batched by token length: prompts of the same length run as one
batch, so no padding (and no padding mask) is ever needed, and every result
is exactly what that prompt gives alone. Groups run one after another.
Sampling too: each prompt draws from its own random stream, derived from the
seed and the prompt itself (its text, and which repeat of that text it is),
never from its position or its neighbours, so ``--seed 7`` gives a prompt the
same text alone or in any batch.

The context window is GPT-2's ``n_positions`` (1024): a prompt longer than
that is refused; generation stops when the window is full, with
``stop_reason = "context"`` (the app says so).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from model.sampling import Sampling, next_token


@dataclass
class Result:
    prompt: str
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)  # new tokens only: those of ``text`` (see _tokens_covering)
    text: str = ""  # new text only (cut at a stop string)
    stop_reason: str = "length"  # length | eos | stop | context | interrupted
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    done: bool = False

    @property
    def decode_tokens_per_second(self) -> float:
        steps = max(len(self.tokens) - 1, 0)  # the first new token comes from the prefill
        return steps / self.decode_seconds if self.decode_seconds > 0 else 0.0


class ContextError(ValueError):
    """A prompt that does not fit GPT-2's context window."""


class NotANumberError(ValueError):
    """The model's scores hold NaN: its weights are not finite numbers."""


def encode_prompts(tokenizer, prompts: list[str], config) -> list[list[int]]:
    """Each prompt's token ids; ContextError for one that encodes to nothing or
    does not fit the context window. Needs only the tokenizer and the config,
    so the command line checks prompts before it loads the model."""
    encoded = [tokenizer.encode(p) for p in prompts]
    for ids in encoded:
        if len(ids) == 0:
            raise ContextError("the prompt encodes to no tokens")
        if len(ids) > config.n_positions:
            raise ContextError(f"the prompt has {len(ids)} tokens; GPT-2's context holds {config.n_positions}")
    return encoded


def generate(gpt2, prompts: list[str], max_new_tokens: int, sampling: Sampling, seed: int | None = None,
             on_text: Callable[[int, str], None] | None = None) -> list[Result]:
    """Continue every prompt; ``on_text(index, new_text)`` streams text as it comes.

    A KeyboardInterrupt stops generation cleanly: the results so far come back
    with ``stop_reason = "interrupted"``."""
    results = [Result(p, ids) for p, ids in zip(prompts, encode_prompts(gpt2.tokenizer, prompts, gpt2.config))]
    rngs = prompt_streams(seed, prompts)
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(results):
        groups.setdefault(len(r.prompt_tokens), []).append(i)
    try:
        for length, members in groups.items():
            _generate_group(gpt2, [results[i] for i in members], members, max_new_tokens, sampling,
                            [rngs[i] for i in members], on_text)
    except KeyboardInterrupt:
        for r in results:
            if not r.done:
                r.stop_reason = "interrupted"
    return results


def _generate_group(gpt2, group: list[Result], indices: list[int], max_new_tokens: int, sampling: Sampling,
                    rngs: list[np.random.Generator], on_text) -> None:
    tokenizer = gpt2.tokenizer
    eos = set(gpt2.eos_token_ids)  # the checkpoint's (generation_config.json), else the tokenizer's
    tokens = len(tokenizer)  # rows past it (a padded vocabulary) are never sampled: nothing could decode them
    ids = np.array([r.prompt_tokens for r in group], dtype=np.int64)
    room = gpt2.config.n_positions - ids.shape[1]
    steps = min(max_new_tokens, room + 1)  # the last token needs no position of its own
    active = [True] * len(group)
    shown = [""] * len(group)
    last = np.zeros((len(group), 1), dtype=np.int64)  # each row's latest token, fed next

    start = time.perf_counter()
    # The cache holds the prompt and every token fed back (the last one is not).
    logits, cache = gpt2.step(ids, gpt2.empty_cache(len(group), ids.shape[1] + steps - 1))
    finite(logits, gpt2)
    prefill = time.perf_counter() - start
    for r in group:
        r.prefill_seconds = prefill
    decode_start = time.perf_counter()
    for step in range(steps):
        if step > 0:
            logits, cache = gpt2.step(last, cache)
            finite(logits, gpt2)
        for b, r in enumerate(group):
            if not active[b]:
                continue
            token = next_token(logits[b, :tokens], sampling, rngs[b], r.prompt_tokens + r.tokens)
            last[b, 0] = token
            r.tokens.append(token)
            if token in eos:
                # Step 12's rule, and HF generate's: stop right after an end
                # token and keep it in the tokens; the text never shows it.
                active[b], r.stop_reason = False, "eos"
                continue
            text = tokenizer.decode(r.tokens)
            cut = _first_stop(text, sampling.stop)
            if cut is not None:
                text, active[b], r.stop_reason = text[:cut], False, "stop"
                r.tokens = _tokens_covering(tokenizer, r.tokens, cut)
            r.text = text
            # Stream only complete characters: a token can end mid-UTF-8.
            if on_text and not text.endswith("\ufffd") and len(text) > len(shown[b]):
                on_text(indices[b], text[len(shown[b]):])
                shown[b] = text
        for r in group:
            r.decode_seconds = time.perf_counter() - decode_start
        if not any(active):
            break
    for b, r in enumerate(group):
        r.done = True
        if active[b] and len(r.tokens) < max_new_tokens:
            r.stop_reason = "context"
        if on_text and len(r.text) > len(shown[b]):
            on_text(indices[b], r.text[len(shown[b]):])


def finite(logits: np.ndarray, gpt2) -> None:
    """NotANumberError when ``logits`` hold a NaN (microseconds a step): NaN
    or infinite weights make NaN scores, which no token can be picked from."""
    if np.isnan(logits).any():
        raise NotANumberError(f"the model's scores are NaN: the weights in {gpt2.source} hold NaN or infinite "
                              "values")


def prompt_streams(seed: int | None, prompts: list[str]) -> list[np.random.Generator]:
    """One generator per prompt, from (seed, the prompt's text, which repeat of
    that text it is): two copies of one prompt get two different samples, and
    nothing depends on the other prompts. No seed: fresh entropy each."""
    seen: dict[str, int] = {}
    streams = []
    for prompt in prompts:
        repeat = seen[prompt] = seen.get(prompt, -1) + 1
        if seed is None:
            streams.append(np.random.default_rng())
            continue
        text = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:16], "little")
        streams.append(np.random.default_rng([seed, text, repeat]))
    return streams


def _tokens_covering(tokenizer, tokens: list[int], length: int) -> list[int]:
    """The shortest prefix of ``tokens`` whose text reaches ``length``
    characters: the tokens of the text a stop string cut (the last one may
    run into the stop string when it starts mid-token)."""
    for k in range(len(tokens) + 1):
        if len(tokenizer.decode(tokens[:k])) >= length:
            return tokens[:k]
    return tokens


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    cuts = [text.find(s) for s in stops if s in text]
    return min(cuts) if cuts else None
