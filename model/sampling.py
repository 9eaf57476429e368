"""Choosing the next token from logits: greedy, temperature, top-k, top-p and
a repetition penalty, on the host in float64 numpy (the model's part ends at
the logits; this costs microseconds next to a forward pass)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.8  # 0: greedy
    top_k: int | None = 200  # keep the k most likely tokens (None: all)
    top_p: float = 1.0  # keep the smallest set with this much probability (1: all)
    repetition_penalty: float = 1.0  # > 1 discourages tokens already present (CTRL-style)
    stop: tuple[str, ...] = field(default=())

    def validate(self) -> None:
        """Raise ValueError with a one-line message for impossible settings."""
        if not self.temperature >= 0:
            raise ValueError(f"--temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.temperature == float("inf"):  # every token alike: noise, not text
            raise ValueError("--temperature must be finite (0 is greedy; 1 samples the model as it is; the server "
                             "takes at most 2)")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"--top-k must be >= 1, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"--repetition-penalty must be > 0, got {self.repetition_penalty}")
        if any(s == "" for s in self.stop):
            raise ValueError("--stop strings must not be empty")


def next_token(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator,
               history: list[int] | None = None) -> int:
    """One token id from the logits [vocab] of the last position."""
    if sampling.temperature == 0 and (sampling.repetition_penalty == 1.0 or not history):
        # Greedy on the logits as they are: float32 -> float64 is exact, so the
        # argmax is the same, without copying the vocabulary's scores every token.
        return int(np.argmax(logits))
    scores = np.asarray(logits, dtype=np.float64).copy()
    if sampling.repetition_penalty != 1.0 and history:
        seen = np.unique(np.asarray(history))
        seen = seen[seen < len(scores)]
        penalised = scores[seen]
        scores[seen] = np.where(penalised > 0, penalised / sampling.repetition_penalty,
                                penalised * sampling.repetition_penalty)
    if sampling.temperature == 0:
        return int(np.argmax(scores))
    # The best score made 0 before dividing: a temperature near 0 then sends the others
    # to -inf (greedy, its limit), never inf - inf (NaN).
    with np.errstate(over="ignore"):
        scores = (scores - scores.max()) / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < len(scores):
        kth = np.partition(scores, -sampling.top_k)[-sampling.top_k]
        scores[scores < kth] = -np.inf
    probs = np.exp(scores)
    probs /= probs.sum()
    if sampling.top_p < 1.0:
        # Only tokens with probability left (after top-k, at most k of them)
        # can be kept: sort those, not the whole vocabulary. Ascending ids +
        # a stable sort keep the ties' order of a full sort.
        candidates = np.flatnonzero(probs)
        order = candidates[np.argsort(-probs[candidates], kind="stable")]
        cumulative = np.cumsum(probs[order])
        keep = cumulative - probs[order] < sampling.top_p  # the first token always stays
        mask = np.zeros_like(probs, dtype=bool)
        mask[order[keep]] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    return int(rng.choice(len(probs), p=probs))
