"""``python -m bench.profile_decode``: where one decode step's time goes.

Splits a batch-1 decode step of the app (``GPT2.step`` then greedy
sampling, as ``model/generate.py`` runs it) into: the compiled graph (the engine's ``Model.execute``),
the Python around it in ``step`` (input buffers, the cache, the logits to
numpy), and choosing the token (``model/sampling.py``). Medians over ``--steps`` steps after a
``--context``-token prefill (default 16; 896 for the bench's long-context figure). Default: the
bench's random GPT-2 124M checkpoint, float32 on the CPU.

``--without layer_norm attention``: what those blocks cost of a step. A second model is built
with each named block's output its input (step 03's layer norms; step 07's attention weights
times v: q passes through), so its tokens are wrong but every other op is the same; the two
graphs' steps are timed alternately over ``--rounds`` (this machine's speed drifts between
minutes) and the medians printed side by side.
"""

from __future__ import annotations

import argparse
import contextlib
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
    p.add_argument("--dtype", default="float32", help="the weights' precision, as the app's --dtype (default: float32)")
    p.add_argument("--steps", type=int, default=64, help="decode steps timed, medians taken (default: 64)")
    p.add_argument("--context", type=int, default=16, help="tokens prefilled before the timed steps (default: 16)")
    p.add_argument("--linear", choices=LINEARS, default="custom",
                   help="custom: the project's few-rows kernels (model/layers/few_rows.py); course: nn.Linear")
    p.add_argument("--without", nargs="+", choices=sorted(LEFT_OUT), default=[], metavar="BLOCK",
                   help=f"also time a graph with these blocks left out ({', '.join(sorted(LEFT_OUT))}), alternated "
                        "with the whole one: what they cost of a step (its tokens are wrong)")
    p.add_argument("--rounds", type=int, default=5, help="alternations with --without (default: 5)")
    args = p.parse_args(argv)
    os.environ[USE] = "0"  # this CPU's own graphs, never one shipped for first runs (model/graph_source.py)
    from bench.common import random_checkpoint
    from model.gpt2 import BuildOptions, load_gpt2
    from model.sampling import Sampling, next_token

    folder = Path(args.model) if args.model else random_checkpoint("gpt2")
    options = BuildOptions(device="cpu", dtype=args.dtype, linear=args.linear)
    gpt2 = load_gpt2(folder, options, with_tokenizer=False)
    if args.context + args.steps > gpt2.config.n_positions:
        p.error(f"--context + --steps must fit the {gpt2.config.n_positions}-position window")
    if args.without:
        return compare_without(gpt2, folder, options, args)
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


# What --without leaves out: the course's method replaced, and what stands in for it (its input, passed through).
LEFT_OUT = {
    "layer_norm": ("LayerNorm", "forward", lambda self, x: x),
    "attention": ("GPT2MultiHeadAttention", "_attn", lambda self, q, k, v, mask: q),
}


@contextlib.contextmanager
def left_out(blocks: list[str]):
    """The course's classes with ``blocks`` passing their input through, while a graph is built
    (through load_gpt2, the one build); its saved graph's name says so (a name is a digest of the
    course's sources, which this leaves as they are: without it the whole graph saved under that
    name would be loaded)."""
    from model import saved_graphs
    from solutions.solution_03 import LayerNorm
    from solutions.solution_07 import GPT2MultiHeadAttention

    classes = {"LayerNorm": LayerNorm, "GPT2MultiHeadAttention": GPT2MultiHeadAttention}
    named = saved_graphs.graph_name
    patched = [(classes[cls], method, stand_in) for cls, method, stand_in in (LEFT_OUT[b] for b in blocks)]
    patched.append((saved_graphs, "graph_name",
                    lambda *a, **k: f"{named(*a, **k)}_without_{'_'.join(sorted(blocks))}"))
    kept = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    try:
        for owner, name, stand_in in patched:
            setattr(owner, name, stand_in)
        yield
    finally:
        for owner, name, original in reversed(kept):
            setattr(owner, name, original)


def compare_without(whole, folder: Path, options, args) -> int:
    """The ``whole`` model's step against one built with ``args.without`` left out, alternated."""
    from model.gpt2 import load_gpt2

    models = {"whole step": whole}
    with left_out(args.without):
        models[f"without {' and '.join(args.without)}"] = load_gpt2(folder, options, with_tokenizer=False)
    prompt = np.arange(args.context)[None] % models["whole step"].config.vocab_size

    def step_ms(gpt2) -> float:
        logits, cache = gpt2.step(prompt, gpt2.empty_cache(1, args.context + args.steps))
        token = np.array([[int(logits[0].argmax())]])
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            logits, cache = gpt2.step(token, cache)
            times.append(time.perf_counter() - t0)
            token = np.array([[int(logits[0].argmax())]])
        return statistics.median(times) * 1000

    for gpt2 in models.values():
        step_ms(gpt2)  # warm-up
    rounds: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, gpt2 in models.items():
            rounds[name].append(step_ms(gpt2))
    print(f"{folder.name}, {args.dtype} ({args.linear} linear), batch 1, a decode step (GPT2.step) after a "
          f"{args.context}-token prefill: medians of {args.steps} steps, then of {args.rounds} alternated rounds")
    whole = statistics.median(rounds["whole step"])
    for name, values in rounds.items():
        ms = statistics.median(values)
        print(f"  {name:<36}{ms:8.2f} ms  ({min(values):.2f}-{max(values):.2f})"
              + ("" if name == "whole step" else f"  the blocks left out: {whole - ms:+.2f} ms of the step"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
