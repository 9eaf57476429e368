"""``python -m bench.memory``: peak memory of ``generate`` and of
``attention-map`` on the same long prompt, each in its own process.

The attention map's graph is generate's plus one output (one layer's
probabilities, [n_head, seq, seq]), so its peak should exceed generate's by
about that array, not by every layer's. Default: a GPT-2 124M-shaped random
checkpoint (the bench's, with the GPT-2 tokenizer) and a prompt of ~1000
tokens; ``--model`` names another. Run it twice: a process that compiles
its graph (the first run, or after a change to model/) also holds the
compiler's memory, ~1 GB more for the 124M graphs here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import random_checkpoint
from model.graph_source import USE

HERE = Path(__file__).resolve().parent
SENTENCE = "The cat sat on the mat because it was tired. "  # 11 tokens


def peak_rss_mb(args: list[str]) -> float:
    """Run ``python -m ARGS`` to the end; its peak resident memory in MB."""
    child = subprocess.Popen([sys.executable, "-m", *args], cwd=HERE.parent, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed: {child.stderr.read().strip().splitlines()[-1:]}")
    return usage.ru_maxrss / 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint folder (default: a random 124M-shaped one)")
    p.add_argument("--layer", type=int, default=5)
    p.add_argument("--repeat", type=int, default=90, help="sentences in the prompt (default: 90, ~990 tokens)")
    args = p.parse_args(argv)
    os.environ[USE] = "0"  # this CPU's own graphs, never one shipped for first runs (model/graph_source.py)
    folder = Path(args.model) if args.model else random_checkpoint("gpt2")
    prompt = (SENTENCE * args.repeat).strip()
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        prompt_file.write_text(prompt + "\n")
        base = ["--model", str(folder), "--device", "cpu"]
        generate = peak_rss_mb(["model", *base, "--prompt-file", str(prompt_file), "--max-new-tokens", "1",
                                "--temperature", "0", "--quiet"])
        amap = peak_rss_mb(["model.attention_map", *base, "--layer", str(args.layer), "--head", "0",
                            "--out", str(Path(tmp) / "a.png"), prompt])
    print(f"model: {folder.name}; prompt: {args.repeat} sentences")
    print(f"generate (1 new token)        peak RSS {generate:8.0f} MB")
    print(f"attention-map --layer {args.layer:<2}      peak RSS {amap:8.0f} MB  ({amap - generate:+.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
