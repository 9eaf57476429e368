"""The benchmark's own machinery on a small model (its figures are not tested:
speed targets live in the benchmark, not in timed tests)."""

from __future__ import annotations

from bench.__main__ import measure_ours, table
from weights.synthetic import write_checkpoint

# The same shape as tests/test_app.py's checkpoint: MAX's disk cache has its graph.
SIZES = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)


def test_measure_and_table(tmp_path):
    folder = write_checkpoint(tmp_path / "m", SIZES, seed=5)
    ours = measure_ours(folder, "float32", "cpu", reps=1, new_tokens=4, prefill=(16, 32), batches=(1, 2))
    assert set(ours["prefill_ms"]) == {"16", "32"} and set(ours["decode_tok_s"]) == {"1", "2"}
    assert ours["ttft_ms"] == ours["prefill_ms"]["16"] and ours["peak_rss_mb"] > 0
    ours["prefill_ms"]["512"], ours["decode_tok_s"]["8"] = 10.0, 400.0
    hf = {"prefill_ms": {"16": 20.0, "512": 20.0}, "decode_tok_s": {"1": ours["decode_tok_s"]["1"] / 2, "8": 100.0},
          "ttft_ms": 20.0, "peak_rss_mb": ours["peak_rss_mb"]}
    text = table([ours], hf)
    assert "decode, batch 8 (tok/s)" in text and "4.00x" in text and "2.00x" in text  # 400/100, 20/10
    assert "-" in table([ours], None)
