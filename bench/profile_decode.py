"""``python -m bench.profile_decode``: where one decode step's time goes.

Splits a batch-1 decode step of the app (``GPT2.step`` then greedy
sampling, as ``model/generate.py`` runs it) into: the compiled graph (the engine's ``Model.execute``),
the Python around it in ``step`` (input buffers, the cache, the logits to
numpy), and choosing the token (``model/sampling.py``). Medians over ``--steps`` steps after a
``--context``-token prefill (default 16; 896 for the bench's long-context figure). Default: the
bench's random GPT-2 124M checkpoint, float32 on the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from model.graph_source import USE
from model.options import LINEARS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint folder (default: the bench's random gpt2)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--context", type=int, default=16, help="tokens prefilled before the timed steps (default: 16)")
    p.add_argument("--linear", choices=LINEARS, default="custom",
                   help="custom: the project's few-rows kernels (model/layers/few_rows.py); course: nn.Linear")
    args = p.parse_args(argv)
    os.environ[USE] = "0"  # this CPU's own graphs, never one shipped for first runs (model/graph_source.py)
    from bench.common import random_checkpoint
    from model.gpt2 import BuildOptions, load_gpt2
    from model.sampling import Sampling, next_token

    folder = Path(args.model) if args.model else random_checkpoint("gpt2")
    gpt2 = load_gpt2(folder, BuildOptions(device="cpu", dtype=args.dtype, linear=args.linear), with_tokenizer=False)
    graph_seconds: list[float] = []
    model = gpt2.compiled.engine_model

    class Timed:  # the engine's call alone (what GPT2._run executes)
        @staticmethod
        def execute(*buffers):
            start = time.perf_counter()
            out = model.execute(*buffers)
            graph_seconds.append(time.perf_counter() - start)
            return out

    gpt2.compiled = SimpleNamespace(engine_model=Timed())
    greedy, rng = Sampling(temperature=0.0, top_k=None), np.random.default_rng(0)
    if args.context + args.steps > gpt2.config.n_positions:
        p.error(f"--context + --steps must fit the {gpt2.config.n_positions}-position window")
    prompt = np.arange(args.context)[None] % gpt2.config.vocab_size
    logits, cache = gpt2.step(prompt, gpt2.empty_cache(1, args.context + args.steps))
    token = next_token(logits[0], greedy, rng)
    parts: dict[str, list[float]] = {k: [] for k in ("graph", "around it (inputs, cache, logits)", "sampling",
                                                     "step total")}
    for _ in range(args.steps):
        t0 = time.perf_counter()
        logits, cache = gpt2.step(np.array([[token]]), cache)
        t1 = time.perf_counter()
        token = next_token(logits[0], greedy, rng)
        t2 = time.perf_counter()
        parts["graph"].append(graph_seconds[-1])
        parts["around it (inputs, cache, logits)"].append(t1 - t0 - graph_seconds[-1])
        parts["sampling"].append(t2 - t1)
        parts["step total"].append(t2 - t0)
    total = statistics.median(parts["step total"])
    print(f"{folder.name}, {args.dtype} ({args.linear} linear), batch 1, {args.steps} decode steps "
          f"after a {args.context}-token prefill (medians)")
    for key, values in parts.items():
        ms = statistics.median(values) * 1000
        print(f"  {key:<36}{ms:8.2f} ms  {ms / total / 10:5.1f}%")
    print(f"  => {1 / total:.1f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
