"""Serving throughput: this project's `python -m serve` against llama.cpp's llama-server.

    python -m bench.serve                          # the bench's random 124M checkpoint
    python -m bench.serve --model demo --concurrency 1,8

Both servers get the same checkpoint (llama.cpp: the float32 GGUF that
bench/gguf_export.py writes from it), the same threads (all cores), and the
same request mix: prompts of mixed lengths, a fixed number of new tokens each,
temperature 0, streamed (so the time to first token is seen as a client sees
it), no prompt sent twice in a round (a server that finds a prompt in its
cache would skip its prefill: llama-server does by default). For each
concurrency (clients sending back to back) it reports requests/s, output
tokens/s and time to first token p50/p99, and the ratio of output tokens/s
(ours / llama-server: > 1 means we are faster). One run each:
compare ratios, not absolute figures, on a noisy machine.

Output tokens are what each server says it produced (``usage`` in the last
streamed chunk) when it says so, else the streamed text re-tokenized.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from model.options import LINEARS
from serve import step_times
from serve.__main__ import MAX_BATCH_SIZE
from serve.process import NotReady, free_port, group_alive, stop, wait_ready  # noqa: F401  (the tests' too)

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TOKENS = (16, 64, 128, 256)  # the mix, cycled over the requests


def prompt_lengths(n_positions: int, max_tokens: int) -> tuple[int, ...]:
    """PROMPT_TOKENS, scaled down for a model whose window cannot hold twice
    the longest (random ids may re-tokenize longer) plus the new tokens."""
    room = (n_positions - max_tokens - 16) / (2 * max(PROMPT_TOKENS))
    if room <= 0:
        raise SystemExit(f"bench.serve: --max-tokens {max_tokens} leaves no room for a prompt in "
                         f"this model's {n_positions}-token window")
    return PROMPT_TOKENS if room >= 1 else tuple(max(4, int(n * room)) for n in PROMPT_TOKENS)


def prompts(tokenizer, count: int, seed: int = 0, lengths: tuple[int, ...] = PROMPT_TOKENS) -> list[str]:
    """``count`` prompts of ``lengths`` tokens in turn, from fixed random ids."""
    rng = np.random.default_rng(seed)
    return [tokenizer.decode(rng.integers(256, 50000, lengths[i % len(lengths)]).tolist()) for i in range(count)]


def one_request(base: str, model: str, prompt: str, max_tokens: int, tokenizer) -> dict:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(base + "/v1/completions", data=body, headers={"content-type": "application/json"})
    start = time.perf_counter()
    first, text, usage = None, [], None
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"].get("completion_tokens")
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    first = first or time.perf_counter()
                    text.append(choice["text"])
    end = time.perf_counter()
    tokens = usage if usage else len(tokenizer("".join(text))["input_ids"])
    return {"ttft": (first or end) - start, "tokens": tokens, "seconds": end - start}


def run_load(base: str, model: str, texts: list[str], max_tokens: int, concurrency: int, tokenizer) -> dict:
    """``texts[0]`` once to warm (first-request costs are not throughput), then the rest."""
    warm, texts = texts[0], texts[1:]
    one_request(base, model, warm, 4, tokenizer)
    def attempt(text: str) -> dict | None:
        try:
            return one_request(base, model, text, max_tokens, tokenizer)
        except urllib.error.HTTPError as exc:  # counted, not fatal: a line under the table says how many
            print(f"bench.serve: a request failed: {exc.code} {exc.read()[:200]!r}", file=sys.stderr)
            return None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, cut short: counted the same
            print(f"bench.serve: a request failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return None

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answered = list(pool.map(attempt, texts))
    wall = time.perf_counter() - start
    results = [r for r in answered if r is not None]
    if not results:
        raise SystemExit("bench.serve: every request failed")
    ttft = sorted(r["ttft"] for r in results)
    return {
        "concurrency": concurrency, "requests": len(results), "failed": len(answered) - len(results),
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(results) / wall, 3),
        "output_tokens_per_s": round(sum(r["tokens"] for r in results) / wall, 1),
        "ttft_p50_ms": round(1000 * statistics.median(ttft), 1),
        "ttft_p99_ms": round(1000 * ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 1),
    }


def level_prompts(tokenizer, levels, lengths, round_number: int, per_client: int = 2) -> dict[int, list[str]]:
    """For each concurrency, its warm-up prompt and its requests' prompts:
    no two alike in a round, so that no server skips a prefill by finding the
    prompt in its cache (llama-server keeps each slot's last prompt and reuses
    it by default); both servers of a round get the same."""
    return {c: prompts(tokenizer, 1 + max(16, per_client * c), seed=1 + 1000 * round_number + c, lengths=lengths)
            for c in levels}


def measure(name: str, command: list[str], model: str, texts: dict[int, list[str]], max_tokens, tokenizer,
            log: Path, env: dict[str, str] | None = None) -> list[dict]:
    """Start ``command`` (``env`` added to its environment) and load it at each
    concurrency of ``texts`` (its prompts, level_prompts)."""
    port = free_port()
    command = [part.replace("{port}", str(port)) for part in command]
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        # env passed explicitly: once MAX has run, its runtime's C-level
        # PYTHONPATH would hide the venv's packages from a child.
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, **(env or {})})
    try:
        try:
            ready = wait_ready(base, process, 1800, name)
        except NotReady as exc:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise SystemExit(f"bench.serve: {exc}; the last lines of {log}:\n{tail}") from None
        print(f"{name}: ready in {ready:.0f} s (log: {log})", file=sys.stderr)
        rows = []
        for c, level_texts in texts.items():
            row = {"server": name, **run_load(base, model, level_texts, max_tokens, c, tokenizer)}
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
        return rows
    finally:
        stop(process)


def ours_env(steps_file: Path | None = None, graphs: str = "own") -> dict[str, str]:
    """What this project's server is started with: this CPU's own graphs by default, as the app's
    bench measures (the ones shipped for a first start are x86-64-v3's: on a CPU with AVX-512 their
    kernels are the avx2 ones), or ``graphs="shipped"``; each step timed into ``steps_file`` when one
    is given."""
    from model.graph_source import USE

    return {USE: "0" if graphs == "own" else "1", **({step_times.VARIABLE: str(steps_file)} if steps_file else {})}


def table(ours: list[dict], llama: list[dict] | None, baseline: str = "llama-server") -> str:
    lines = ["| concurrency | server | requests/s | output tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | "
             f"tokens/s vs {baseline} |",
             "|---|---|---|---|---|---|---|"]
    by_c = {r["concurrency"]: r for r in llama or []}
    for r in ours:
        other = by_c.get(r["concurrency"])
        ratio = f"{r['output_tokens_per_s'] / other['output_tokens_per_s']:.2f}x" if other else "n/a"
        for row, label in ((r, "MAX serve (this project)"), (other, baseline)):
            if row:
                lines.append(f"| {r['concurrency']:g} | {label} | {row['requests_per_s']:.3f} | "
                             f"{row['output_tokens_per_s']:.1f} | {row['ttft_p50_ms']:.1f} | "
                             f"{row['ttft_p99_ms']:.1f} | {ratio if row is r else ''} |")
    failed = [f"{label} at {row['concurrency']:g} clients: {row['failed']:g} of {row['requests'] + row['failed']:g}"
              for r in ours for row, label in ((r, "MAX serve"), (by_c.get(r["concurrency"]), baseline))
              if row and row.get("failed")]
    if failed:
        lines.append("\nrequests that failed (refused, reset or an HTTP error; not in the figures above): "
                     + "; ".join(failed))
    return "\n".join(lines)


def round_ratios(rounds: list[tuple[list[dict], list[dict] | None]], baseline: str = "llama-server") -> list[str]:
    """Per concurrency, each round's output tokens/s against llama-server's in
    the same round, and their median."""
    from bench.common import spread

    lines = []
    for c in dict.fromkeys(r["concurrency"] for ours, _ in rounds for r in ours):
        xs = []
        for ours, llama in rounds:
            mine = next((r for r in ours if r["concurrency"] == c), None)
            theirs = next((r for r in llama or [] if r["concurrency"] == c), None)
            if mine and theirs and theirs["output_tokens_per_s"]:
                xs.append(mine["output_tokens_per_s"] / theirs["output_tokens_per_s"])
        if xs:
            lines.append(f"{c} clients, output tokens/s vs {baseline} per round: {spread(xs)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint folder or `demo` (default: the bench's random 124M)")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"],
                   help="python -m serve --device: the CPU (default) or a GPU, float32 on either")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts (default 1,8,32)")
    p.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE,
                   help=f"sequences both servers decode at a time (default {MAX_BATCH_SIZE}, the server's own "
                        "default: what a user who starts it as the README says gets)")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request (default 64)")
    p.add_argument("--llama-cpp", type=Path, default=None,
                   help="llama.cpp bin dir (default: what `pixi run llama-setup` built)")
    p.add_argument("--no-llama-cpp", action="store_true", help="measure this project's server only")
    p.add_argument("--hf-python", metavar="PYTHON",
                   help="an interpreter with torch: the baseline is Hugging Face's generate in a loop, one request "
                        "at a time (bench/hf_server.py; float32, as the server), instead of llama-server")
    p.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    p.add_argument("--graphs", default="own", choices=("own", "shipped"),
                   help="this project's server on this CPU's own compiled graphs (default: compiled once, then "
                        "MAX's cache), or on the x86-64-v3 graphs shipped for a first start (what a CPU with "
                        "AVX-512 gives up with them)")
    p.add_argument("--linear", default="custom", choices=LINEARS,
                   help="python -m serve --linear: this project's Mojo op (custom, default) or nn.Linear (course)")
    p.add_argument("--rounds", type=int, default=1,
                   help="start and measure both servers N times, alternated; the table shows medians across the "
                        "rounds and a line per concurrency each round's ratio (default: 1)")
    p.add_argument("--requests-per-client", type=int, default=2, metavar="K",
                   help="requests per concurrency level: K per client, at least 16 (default: 2)")
    p.add_argument("--serve-flag", action="append", default=[], metavar="FLAG",
                   help="pass FLAG on to max serve (repeatable), e.g. --serve-flag=--enable-chunked-prefill")
    p.add_argument("--step-times", action="store_true",
                   help="time every step of this project's server: the graph's share and the engine's, per batch "
                        "size (serve/step_times.py; the timing waits for the device after each step)")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]

    from bench.common import merge_rounds, random_checkpoint
    from bench.llama_cpp import built, gguf_files
    from model import caches
    from weights import load_tokenizer, read_config, resolve_model

    folder = resolve_model(args.model) if args.model else random_checkpoint("gpt2")
    tokenizer = load_tokenizer(folder)
    n_positions = read_config(folder).n_positions
    lengths = prompt_lengths(n_positions, args.max_tokens)
    # Random ids may re-tokenize longer than they were drawn: room for twice the longest.
    window = min(n_positions, 2 * max(lengths) + args.max_tokens + 16)
    logs = caches.folder("bench-serve")
    logs.mkdir(parents=True, exist_ok=True)
    threads = str(os.cpu_count() or 1)
    batch = str(args.max_batch_size)

    if args.rounds < 1 or args.requests_per_client < 1:
        p.error("--rounds and --requests-per-client must be at least 1")
    # llama.cpp is built here for the CPU: no baseline for a server on the GPU.
    bin_dir = None if args.no_llama_cpp or args.hf_python or args.device == "gpu" else (args.llama_cpp or built())
    if bin_dir is not None and not (Path(bin_dir) / "llama-server").is_file():
        bin_dir = None
        if not args.no_llama_cpp:
            print("bench.serve: no llama-server (run `pixi run llama-setup`); measuring this project only",
                  file=sys.stderr)
    rounds = []
    steps_file = logs / "max-serve-steps.jsonl"
    if args.step_times:
        steps_file.unlink(missing_ok=True)  # this run's steps only
    for number in range(args.rounds):
        if args.rounds > 1:
            print(f"round {number + 1} of {args.rounds}", file=sys.stderr, flush=True)
        texts = level_prompts(tokenizer, levels, lengths, number, args.requests_per_client)
        # Its metrics on a free port too: a server already on MAX's default one would refuse to start.
        ours = measure("max-serve", [sys.executable, "-m", "serve", "--model", str(folder), "--device", args.device,
                                     "--port", "{port}", "--metrics-port", str(free_port()),
                                     "--max-batch-size", batch, "--max-length", str(window),
                                     "--linear", args.linear,
                                     *(["--", *args.serve_flag] if args.serve_flag else [])],
                       str(folder), texts, args.max_tokens, tokenizer, logs / "max-serve.log",
                       ours_env(steps_file if args.step_times else None, args.graphs))
        theirs = None  # the baseline's rows: llama-server, or HF generate with --hf-python
        try:  # a baseline that does not start loses its column, not this project's figures
            if bin_dir is not None:
                gguf = gguf_files(Path(bin_dir), folder)["f32"]
                theirs = measure("llama-server", [str(Path(bin_dir) / "llama-server"), "-m", str(gguf), "-t", threads,
                                                  "--host", "127.0.0.1", "--port", "{port}", "-np", batch,
                                                  "-c", str(int(batch) * window), "--cont-batching"],
                                 "model", texts, args.max_tokens, tokenizer, logs / "llama-server.log")
            if args.hf_python:
                cuda = args.device == "gpu"
                theirs = measure("hf-generate", [args.hf_python, str(ROOT / "bench" / "hf_server.py"), str(folder),
                                                 "--port", "{port}", "--device", "cuda" if cuda else "cpu",
                                                 "--dtype", "float32"],
                                 str(folder), texts, args.max_tokens, tokenizer, logs / "hf-generate.log")
        except SystemExit as exc:
            print(f"{exc}; no baseline this round", file=sys.stderr)
        rounds.append((ours, theirs))
    ours = merge_rounds([o for o, _ in rounds], key="concurrency")
    theirs = merge_rounds([t for _, t in rounds if t], key="concurrency") or None
    precision = "float32" if args.device == "cpu" else "float32 on the GPU"
    print(f"\n{folder.name}, {precision}, {threads} threads, {args.max_tokens} new tokens per request, prompts of "
          f"{'/'.join(map(str, lengths))} tokens")
    print(f"both servers decode {batch} sequences at a time (--max-batch-size {batch}; llama-server -np {batch})"
          + (", as `pixi run serve` does by default" if int(batch) == MAX_BATCH_SIZE
             else f"; `pixi run serve` defaults to {MAX_BATCH_SIZE}") + "\n")
    baseline = "HF generate, one at a time" if args.hf_python else "llama-server"
    print(table(ours, theirs, baseline))
    if args.rounds > 1 and theirs:
        print("\n".join(["", *round_ratios(rounds, baseline)]))
    if args.step_times:
        print(f"\nmax-serve's steps, every round (medians; {steps_file}):")
        print(step_times.table(step_times.summary(step_times.read(steps_file))))
    if args.json:
        key = "hf_generate" if args.hf_python else "llama_server"
        args.json.write_text(json.dumps({"ours": ours, key: theirs, "rounds": [{"ours": o, key: t} for o, t in rounds]},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
