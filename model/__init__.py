"""The GPT-2 the app runs: load (weights/), compile (gpt2.py), sample, generate."""
