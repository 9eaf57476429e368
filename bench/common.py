"""What several bench entry points share: the random checkpoints they measure
(model/caches.py writes them), and how rounds of figures are merged and
their ratios printed.

(``python -m bench``, ``bench.memory``, ``bench.profile_decode`` and
``bench.serve`` import these from here, not from one another.)
"""

from __future__ import annotations

import statistics

from model.caches import random_checkpoint  # noqa: F401  (the bench's modules import it from here)

PER_PROCESS = ("compile_s", "load_s", "start_to_first_token_s", "peak_rss_mb", "rss_per_weight_byte")


def merge_rounds(rounds: list[list[dict]], key: str = "dtype") -> list[dict]:
    """One result per precision (or other ``key``) from several rounds: every
    number the median of that number across the rounds that measured it
    (nested figures too), everything else as the first round had it; the
    PER_PROCESS figures from the rounds that loaded a saved graph, where
    there are any (a compile is not a start)."""
    def merge(values: list):
        if all(isinstance(v, dict) for v in values):
            return {k: merge([v[k] for v in values if k in v]) for k in values[0]}
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return statistics.median(values)
        return values[0]

    by_key: dict = {}
    for results in rounds:
        for r in results:
            by_key.setdefault(r[key], []).append(r)
    merged = []
    for rs in by_key.values():
        m = merge(rs)
        warm = [r for r in rs if r.get("saved_graph")]
        m.update({k: merge([r[k] for r in warm]) for k in PER_PROCESS if warm and all(k in r for r in warm)})
        merged.append(m)
    return merged


def spread(ratios: list[float]) -> str:
    """Each round's ratio, then their median: "0.50 / 0.90 / 1.50 (median 0.90x)"."""
    return f"{' / '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}x)"
