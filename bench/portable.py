"""``python -m bench.portable``: a shipped graph against this CPU's own.

The project ships the demo's and GPT-2 124M's graphs compiled for x86-64-v3,
whose kernels take their avx2 path (model/graph_source.py; and for Arm's Neoverse
N1, whose portable path is every Arm CPU's own, so the ratio is noise there).
On a CPU with AVX-512 and VNNI, the app uses one on the first run and
compiles the CPU's own graph (the avx512-vnni path) in the background for
the next. This measures what the first runs give up: the app's own greedy
decode (``python -m model --json``, ``--model`` the demo or a random GPT-2
124M checkpoint, ``--device cpu``) with each graph, each run a fresh
process, the two alternated for ``--rounds`` rounds, the order swapped every
round. It prints each one's median decode and prefill, the ratios, and
whether both wrote the same tokens (they must). On an AVX2 CPU both take the
avx2 path: the ratio is noise there. ``--prompt-tokens`` gives a longer
prompt (the short one repeated), whose prefill is the matmuls' work rather
than reading the weights once.

Each graph has its own project cache folder (under this one's
``portable-bench``): the shipped graph's runs never compile the CPU's own
graph, which the app would prefer once saved. The first run of each is not
timed: the CPU's own graph compiles then (a minute or more, cached after).
The runs see no GPU: this is the CPU's bench, on a GPU machine too.

    python -m bench.portable --rounds 5
    python -m bench.portable --model gpt2 --rounds 5
    python -m bench.portable --model gpt2 --rounds 3 --prompt-tokens 512 --new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from artifacts.facts import why_not_here
from model import caches, cpu
from model import graph_source as shipped_graphs
from model.device import GPU_VISIBILITY
from weights import resolve_model

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "And it came to pass"
SHIPPED = shipped_graphs.this_machines() or shipped_graphs.X86  # (where none is, main refuses and says why)
GRAPHS = {  # name: (what it is, the environment its runs add)
    "shipped": (f"the shipped graph ({SHIPPED.name}, {SHIPPED.path} kernels)", {shipped_graphs.USE: "1"}),
    "own": (f"this CPU's own graph ({cpu.native_path(cpu.flags())} kernels)", {shipped_graphs.USE: "0"}),
}


def long_prompt(model: str, tokens: int) -> str:
    """``PROMPT`` repeated, cut to ``tokens`` of ``model``'s tokenizer."""
    from weights import load_tokenizer

    tokenizer = load_tokenizer(Path(model))
    ids = tokenizer.encode(" ".join([PROMPT] * tokens))[:tokens]
    return tokenizer.decode(ids)


def run_app(graph: str, model: str, new_tokens: int, folder: Path, prompt: str = PROMPT) -> dict:
    """One run of the app with ``graph``: its JSON line. A run that used the other graph stops the bench."""
    env = dict(os.environ, **GRAPHS[graph][1], **{caches.CACHE: str(folder / graph), shipped_graphs.BACKGROUND: "0"},
               **dict.fromkeys(GPU_VISIBILITY, ""))
    for name in (cpu.ENV, caches.SAVED_GRAPHS):  # the kernels' own choice; graphs saved, as a user has them
        env.pop(name, None)
    command = [sys.executable, "-m", "model", "--model", model, "--device", "cpu", "--temperature", "0",
               "--max-new-tokens", str(new_tokens), "--json", prompt]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench.portable: the {graph} graph's run failed (exit {done.returncode}):\n"
                         + done.stderr[-2000:])
    shipped = any(line.startswith(shipped_graphs.USING) for line in done.stderr.splitlines())
    if shipped != (graph == "shipped"):
        raise SystemExit(f"bench.portable: a run meant for {GRAPHS[graph][0]} used "
                         f"{'the shipped graph' if shipped else 'another'}:\n" + done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.portable", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=shipped_graphs.MODELS, default="demo",
                   help="whose shipped graph: the demo's, or GPT-2 124M's on a random checkpoint (default: demo)")
    p.add_argument("--rounds", type=int, default=5, help="timed runs of each graph, alternated (default: 5)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens each run decodes (default: 128)")
    p.add_argument("--prompt-tokens", type=int, help=f"a prompt of this many tokens ({PROMPT!r} repeated; "
                   "default: that phrase once, 5 tokens)")
    p.add_argument("--json", type=Path, help="also write the figures there")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.new_tokens < 1 or (args.prompt_tokens is not None and args.prompt_tokens < 1):
        p.error("--rounds, --new-tokens and --prompt-tokens must be at least 1")
    target = shipped_graphs.this_machines()
    facts = shipped_graphs.shipped_facts(args.model, target) if target else None
    why = shipped_graphs.none_shipped_here() or ("none is shipped" if facts is None else why_not_here(facts))
    if why:
        p.error(f"the shipped graph cannot run here: {why}")
    # The demo's, or a random one of 124M's shape (written once)
    model = resolve_model("demo") if args.model == "demo" else str(caches.random_checkpoint(args.model))
    prompt = PROMPT if args.prompt_tokens is None else long_prompt(model, args.prompt_tokens)
    folder = caches.folder("portable-bench")
    runs: dict[str, list[dict]] = {graph: [] for graph in GRAPHS}
    for graph in GRAPHS:  # untimed: the own graph compiles, the shipped one is unpacked
        first = run_app(graph, model, args.new_tokens, folder, prompt)
        print(f"{graph}: first run, compile {first['compile_s']:.1f} s", flush=True)
    for round_ in range(args.rounds):
        for graph in (GRAPHS if round_ % 2 == 0 else reversed(GRAPHS)):
            runs[graph].append(run_app(graph, model, args.new_tokens, folder, prompt))
            print(f"round {round_ + 1}: {graph} decode {runs[graph][-1]['decode_tokens_per_s']:.1f} tok/s", flush=True)
    medians = {graph: {key: statistics.median(r[key] for r in rs) for key in ("decode_tokens_per_s", "prefill_ms")}
               for graph, rs in runs.items()}
    same = len({tuple(r["tokens"]) for rs in runs.values() for r in rs}) == 1
    prompt_tokens = runs["shipped"][0]["prompt_tokens"]  # (the app's JSON line always says it)
    print(f"\n{args.rounds} rounds, a prompt of {prompt_tokens} tokens, {args.new_tokens} new tokens, "
          f"{args.model} on {cpu.describe()}:")
    for graph, (what, _) in GRAPHS.items():
        print(f"  {what}: decode {medians[graph]['decode_tokens_per_s']:.1f} tok/s, "
              f"prefill {medians[graph]['prefill_ms']:.1f} ms (medians)")
    ratio = medians["own"]["decode_tokens_per_s"] / medians["shipped"]["decode_tokens_per_s"]
    faster = medians["shipped"]["prefill_ms"] / medians["own"]["prefill_ms"]
    print(f"  own / shipped decode: {ratio:.2f}x; prefill: {faster:.2f}x as fast; "
          f"the same tokens: {'yes' if same else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "cpu": cpu.describe(), "rounds": args.rounds,
                                         "prompt_tokens": prompt_tokens, "new_tokens": args.new_tokens,
                                         "medians": medians, "runs": runs, "same_tokens": same}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
