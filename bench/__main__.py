"""``python -m bench`` (``pixi run bench``): this project against llama.cpp and
Hugging Face transformers + torch on the same machine, the same GPT-2 shape
and checkpoint; prints one table of medians with ratios and writes it as JSON.

Figures: prefill time at 16 and 512 prompt tokens, decode tokens/s over 128
new tokens at batch 1 and 8 and at a long context (tokens 896-1024 of the
window, batch 1) (greedy, KV cache), time to first token (the 16-token
prefill), compile time (this process: small when the graph was saved by an
earlier run, see model/saved_graphs.py), start to first token (process
start, imports, loading, compiling and the first 16-token prefill), peak
memory; with --cold-compile also each precision's first run with empty
caches, as a new user has it: its compile, start to first token and peak
memory (GPT-2 124M's float32 graph, shipped with the project for CPUs with
AVX2 or Arm's Neoverse N1, is not compiled there: model/graph_source.py). Each
precision runs in its own
process, so that its start to first token and peak memory are its own (with
--rounds, taken from the rounds that loaded a saved graph: a compile is not
a start). A
ratio column is how many times faster this project is (their time / ours,
or our tokens/s / theirs): above 1 we win. llama.cpp is compared at the same
weight format (float32 with f32, q8_0 with q8_0, q4_0 with q4_0).

Weights: --model names a checkpoint; by default a random checkpoint of the
chosen GPT-2 size is written once in the cache folder (model/caches.py; speed does not
depend on the values). The baselines are optional, and each is skipped with
a message when absent: llama.cpp (bench/llama_cpp.py builds it from PyPI;
--llama-cpp or GPT2_MAX_LLAMA_CPP names another build) and HF, which needs
torch, not a dependency: name an interpreter that has it with --hf-python or
GPT2_MAX_HF_PYTHON (a Python 3.11 venv with torch and transformers).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROCESS_START = time.perf_counter()

import numpy as np  # noqa: E402

from bench.common import PER_PROCESS, merge_rounds, random_checkpoint, spread  # noqa: E402,F401
from bench.measure import peak_rss_mb, timed  # noqa: E402
from model.device import DTYPES, QUANTIZED_DTYPES  # noqa: E402
from model.options import LINEARS  # noqa: E402

HERE = Path(__file__).resolve().parent


LONG_CONTEXT = 896  # decode tokens 896-1024 of GPT-2's 1024-token window
HF_MODES = ("eager", "compiled")  # bench/hf_baseline.py's
CARD_GIB = 4  # the buffer the card's read bandwidth is measured over: far beyond its caches


def card_read_gb_s() -> float | None:
    """The GPU's read bandwidth as a MAX reduction measures it (bench/bandwidth.py),
    in a child process (its buffer freed before anything else runs), or None where that fails."""
    code = (f"from bench.bandwidth import max_read_bandwidth; print(max_read_bandwidth({CARD_GIB}, device='gpu'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE.parent)
    if done.returncode != 0:
        print(f"the card's read bandwidth was not measured: {(done.stderr.strip().splitlines() or ['failed'])[-1]}",
              file=sys.stderr)
        return None
    return float(done.stdout.strip().splitlines()[-1])


def measure_ours(folder: Path, dtype: str, device: str, reps: int, new_tokens: int,
                 prefill=(16, 512), batches=(1, 8), long_context: int = LONG_CONTEXT, linear: str = "custom",
                 replay: bool = True) -> dict:
    from model.gpt2 import BuildOptions, load_gpt2

    start = time.perf_counter()
    options = BuildOptions(device=device, dtype=dtype, linear=linear, replay=replay)
    gpt2 = load_gpt2(folder, options, with_tokenizer=False)
    load_s = time.perf_counter() - start
    vocab = gpt2.config.vocab_size
    rng = np.random.default_rng(0)
    first = rng.integers(0, vocab, (1, prefill[0]))
    gpt2.step(first, gpt2.empty_cache(1))
    out = {"impl": "max", "dtype": dtype, "device": gpt2.placement.kind, "linear": linear,
           "cache": gpt2.cache, "replay": gpt2.options.replays,
           "compile_s": gpt2.compile_seconds, "saved_graph": gpt2.saved_graph,
           "load_s": load_s, "start_to_first_token_s": time.perf_counter() - PROCESS_START,
           "prefill_ms": {}, "decode_tok_s": {}}
    for n in prefill:
        ids = rng.integers(0, vocab, (1, n))
        gpt2.step(ids, gpt2.empty_cache(1, n))  # warm-up
        if gpt2.cache == "static":  # its buffers are kept per shape: a new cache hands them on, allocating nothing
            new_cache = functools.partial(gpt2.empty_cache, 1, n)
        else:  # each run's made before the clock starts: on a GPU, making one allocates and zeroes device memory
            new_cache = iter([gpt2.empty_cache(1, n) for _ in range(reps)]).__next__
        out["prefill_ms"][str(n)] = 1000 * timed(lambda: gpt2.step(ids, new_cache()), reps)
    out["ttft_ms"] = out["prefill_ms"][str(prefill[0])]
    runs = [(batch, prefill[0], str(batch)) for batch in batches]
    if long_context + new_tokens <= gpt2.config.n_positions:
        runs.append((1, long_context, "long"))
    for batch, context, key in runs:
        ids = rng.integers(0, vocab, (batch, context))

        def decode():
            logits, cache = gpt2.step(ids, gpt2.empty_cache(batch, context + new_tokens))
            start = time.perf_counter()
            for _ in range(new_tokens - 1):
                logits, cache = gpt2.step(logits.argmax(-1)[:, None], cache)
            return time.perf_counter() - start

        decode()  # warm-up
        seconds = statistics.median(decode() for _ in range(reps))
        out["decode_tok_s"][key] = batch * (new_tokens - 1) / seconds
    out["peak_rss_mb"] = peak_rss_mb()
    out["weights_mb"] = gpt2.weight_bytes / 2**20
    out["rss_per_weight_byte"] = out["peak_rss_mb"] / out["weights_mb"]
    # Decode at batch 1 reads every weight once per token: how close it runs to the memory's bandwidth.
    out["weight_gb_s"] = gpt2.weight_bytes * out["decode_tok_s"]["1"] / 1e9 if "1" in out["decode_tok_s"] else None
    return out


def measure_ours_in_child(folder: Path, dtype: str, device: str, reps: int, new_tokens: int,
                          linear: str = "custom", tree: Path = HERE.parent, replay: bool = True) -> dict:
    """``measure_ours`` in a fresh process: start-to-first-token and peak
    memory are per process, so each precision gets its own. ``tree``: the
    checkout whose code runs (bench/ab.py measures another one too). It
    measures this CPU's own graph, never the one shipped for first runs
    (model/graph_source.py: on a CPU with AVX-512 its kernels are the avx2 ones)."""
    from model.graph_source import USE

    args = ["--worker", dtype, "--model", str(folder), "--device", device, "--reps", str(reps),
            "--new-tokens", str(new_tokens), "--linear", linear, *([] if replay else ["--no-replay"])]
    done = subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=tree,
                          env=dict(os.environ, **{USE: "0"}))
    if done.returncode != 0:
        raise RuntimeError(f"{dtype}: " + (done.stderr.strip().splitlines() or ["failed"])[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def cold_start(folder: Path, dtype: str, device: str = "cpu", linear: str = "custom") -> dict:
    """A new user's first run, in a child process with empty caches (MAX's
    and this project's: a fresh XDG_CACHE_HOME, its own folder variable unset; minutes),
    which makes and keeps what a first run does: its compile time, its start
    to first token (process start to the first 16-token prefill's logits)
    and its peak memory."""
    import tempfile

    with tempfile.TemporaryDirectory() as empty:
        code = ("import time; start = time.perf_counter()\n"
                "import json, numpy as np\n"
                "from bench.measure import peak_rss_mb\n"
                "from model.gpt2 import BuildOptions, load_gpt2\n"
                f"options = BuildOptions(device={device!r}, dtype={dtype!r}, linear={linear!r})\n"
                f"g = load_gpt2({str(folder)!r}, options, with_tokenizer=False)\n"
                "g.step(np.arange(16)[None], g.empty_cache(1))\n"
                "print(json.dumps({'cold_compile_s': g.compile_seconds, "
                "'cold_start_to_first_token_s': time.perf_counter() - start, 'cold_peak_rss_mb': peak_rss_mb()}))")
        from model import caches, graph_source
        from model.max_internals import WARM_STORE

        # Nothing of this machine's: no project cache, no saved graphs, no eager kernels named by a parent, no
        # setting of the shipped graphs (a new user's first run uses one where it applies); no background compile
        # of this CPU's own graph, which would outlive the empty folder and run beside the next measurement.
        drop = (caches.CACHE, caches.SAVED_GRAPHS, WARM_STORE, graph_source.USE)
        env = {k: v for k, v in os.environ.items() if k not in drop}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE.parent,
                              env=dict(env, XDG_CACHE_HOME=empty, **{graph_source.BACKGROUND: "0"}))
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"{dtype} (first run, exit {done.returncode}): "
                               + (done.stderr.strip().splitlines() or ["no output"])[-1])
        return json.loads(lines[-1])


def hf_command(python: str, folder: Path, reps: int, new_tokens: int, device: str = "cpu",
               dtype: str = "float32", mode: str = "eager") -> list[str]:
    """bench/hf_baseline.py's command line: HF + torch on the same machine, float32 on the CPU; on a GPU,
    at the precision it is compared with (device "gpu" is torch's "cuda"); ``mode``: eager or compiled."""
    return [python, str(HERE / "hf_baseline.py"), str(folder), "--reps", str(reps), "--new-tokens", str(new_tokens),
            "--device", "cuda" if device == "gpu" else "cpu", "--dtype", dtype, "--mode", mode]


def measure_hf(python: str, folder: Path, reps: int, new_tokens: int, device: str = "cpu",
               dtype: str = "float32", mode: str = "eager") -> dict:
    """HF's figures (``hf_command``); RuntimeError with its last line of error where it fails."""
    done = subprocess.run(hf_command(python, folder, reps, new_tokens, device, dtype, mode), capture_output=True,
                          text=True, env=dict(os.environ))
    if done.returncode != 0:
        raise RuntimeError(f"HF {mode}: " + (done.stderr.strip().splitlines() or ["failed"])[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


ROWS = [  # (label, key, sub-key, unit, higher is better)
    ("prefill 16 tokens", "prefill_ms", "16", "ms", False),
    ("prefill 512 tokens", "prefill_ms", "512", "ms", False),
    ("decode, batch 1", "decode_tok_s", "1", "tok/s", True),
    ("decode, batch 8", "decode_tok_s", "8", "tok/s", True),
    (f"decode at {LONG_CONTEXT}+", "decode_tok_s", "long", "tok/s", True),
    ("time to first token", "ttft_ms", None, "ms", False),
    ("start to first token", "start_to_first_token_s", None, "s", False),
    ("peak memory (RSS)", "peak_rss_mb", None, "MB", False),
    ("weights read, decode batch 1", "weight_gb_s", None, "GB/s", True),
    ("  of the card's read", "card_share_pct", None, "%", True),
    ("weights", "weights_mb", None, "MB", False),
    ("peak memory / weights", "rss_per_weight_byte", None, "x", False),
]
# This project's precision -> llama.cpp's file at the same weight format, byte for byte:
# our q4_0 (every matrix Q4_0) with llama-quantize --pure, our q4_0m (the head in Q6_K)
# with llama-quantize's default Q4_0 (bench/llama_cpp.py).
SAME_PRECISION = {"float32": "f32", "q8_0": "q8_0", "q4_0": "q4_0-pure", "q4_0m": "q4_0"}


def value(result: dict | None, key: str, sub: str | None):
    v = (result or {}).get(key)
    return v.get(sub) if isinstance(v, dict) else v


def ratio(ours: dict, other: dict | None, key: str, sub: str | None, higher: bool) -> float | None:
    """How many times faster ours is (above 1: we win)."""
    v, o = value(ours, key, sub), value(other, key, sub)
    if v is None or o is None or v == 0 or o == 0:
        return None
    return v / o if higher else o / v


# Figures of a whole process: a round whose process compiled its graph (the
# first, after a change to model/) also holds the compiler's time and memory.
def round_ratios(rounds: list[tuple[list[dict], list[dict]]]) -> list[str]:
    """Per precision and figure, this project against llama.cpp at the same
    weight format in each round (both measured minutes apart), and their
    median: the spread is what one run's ratio can be trusted to."""
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for ours, _ in rounds for r in ours):
        figures = []
        for label, key, sub, _, higher in ROWS:
            if key == "ttft_ms":
                continue  # prefill 16 again (figures llama.cpp lacks give no ratio: ratio() answers None)
            xs = []
            for ours, llama in rounds:
                mine = next((r for r in ours if r["dtype"] == dtype), None)
                theirs = next((r for r in llama if r["dtype"] == SAME_PRECISION.get(dtype)), None)
                x = ratio(mine, theirs, key, sub, higher)  # None where either side is missing
                if x is not None:
                    xs.append(x)
            if xs:
                figures.append(f"{label} {spread(xs)}")
        if figures:
            lines.append(f"{dtype} vs llama.cpp {SAME_PRECISION[dtype]}, per round: " + "; ".join(figures))
    return lines


def hf_for(r: dict, hf: list[dict]) -> list[dict]:
    """The HF figures a precision of ours is compared with, each of HF's modes
    (eager, compiled): HF at the same precision where it was measured
    (bfloat16 on a GPU), else HF float32."""
    same = [h for h in hf if h.get("dtype", "float32") == r["dtype"]]
    return same or [h for h in hf if h.get("dtype", "float32") == "float32"]


def hf_name(h: dict) -> str:
    """An HF column's name: its precision, and its mode where it ran compiled."""
    return f"hf {h.get('dtype', 'float32')}" + (" compiled" if h.get("mode") == "compiled" else "")


def table(ours: list[dict], hf: dict | list[dict] | None, llama: list[dict] | None = None) -> str:
    """Every measured column, then ours / HF and ours / llama.cpp at the same precision."""
    llama = llama or []
    hf = [hf] if isinstance(hf, dict) else list(hf or [])
    by_precision = {r["dtype"]: r for r in llama}
    lines = []
    for r in ours:
        few_rows = r.get("linear") == "custom" and r["dtype"] == "float32" and r.get("device", "cpu") == "cpu"
        kernel = ", Linear on the few-rows kernel" if few_rows else ""
        replayed = ", decode replayed from a captured device graph" if r.get("replay") else ""
        lines.append(f"this project, {r['dtype']} on {r['device']}{kernel}{replayed} (compile {r['compile_s']:.1f} s"
                     + f"; start to first token {r['start_to_first_token_s']:.1f} s)"
                     + (f"; with empty caches: compile {r['cold_compile_s']:.1f} s, start to first token "
                        f"{r['cold_start_to_first_token_s']:.1f} s, peak memory {r['cold_peak_rss_mb']:.0f} MB"
                        if "cold_compile_s" in r else ""))
    columns = [(f"max {r['dtype']}", r) for r in ours]
    columns += [(hf_name(h), h) for h in hf or [{"dtype": "float32"}]]
    columns += [(f"llama.cpp {r['dtype']}", r) for r in llama]
    ratios = [(f"vs hf {r['dtype']}" + (" compiled" if h.get("mode") == "compiled" else ""), r, h)
              for r in ours for h in hf_for(r, hf)]
    ratios += [(f"vs l.cpp {r['dtype']}", r, by_precision[SAME_PRECISION[r["dtype"]]])
               for r in ours if SAME_PRECISION.get(r["dtype"]) in by_precision]
    # Each column as wide as its name needs ("llama.cpp q4_0-pure"), at least 15.
    width = {name: max(15, len(name) + 1) for name, *_ in [*columns, *ratios]}
    header = f"{'figure':<24}" + "".join(f"{name:>{width[name]}}" for name, _ in columns)
    header += "".join(f"{name:>{width[name]}}" for name, _, _ in ratios)
    lines += ["", header, "-" * len(header)]
    for label, key, sub, unit, higher in ROWS:
        row = f"{label + ' (' + unit + ')':<24}"
        for name, r in columns:
            v = value(r, key, sub)
            digits = 2 if unit == "x" else 1
            row += f"{v:>{width[name]}.{digits}f}" if v is not None else f"{'-':>{width[name]}}"
        for name, r, other in ratios:
            x = ratio(r, other, key, sub, higher)
            row += f"{x:>{width[name] - 1}.2f}x" if x is not None else f"{'-':>{width[name]}}"
        lines.append(row)
    lines.append("(ratios: how many times faster this project is; above 1 it wins. llama.cpp is compared at the "
                 "same weight format: float32 with f32, q8_0 with q8_0, q4_0 with q4_0 --pure, q4_0m with its "
                 "default q4_0)" if llama else
                 "(ratios: how many times faster this project is; above 1 it wins)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint folder or hub id (default: a random checkpoint of --size)")
    p.add_argument("--size", default="gpt2", choices=["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"],
                   help="GPT-2 shape of the random checkpoint (default: gpt2, 124M)")
    p.add_argument("--dtypes", nargs="+", default=None, choices=[d for d in DTYPES if d != "auto"],
                   help="this project's precisions to measure (default: float32 q8_0 q6_k q4_0 q4_0m on the CPU, "
                        "float32 bfloat16 on a GPU; bfloat16 needs --device gpu)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"],
                   help="as the app's: auto takes a GPU when MAX sees one, else the CPU; cpu or gpu to choose "
                        "(default: auto)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per figure; medians are reported (default: 3)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens per decode run (default: 128)")
    p.add_argument("--hf-python", default=os.environ.get("GPT2_MAX_HF_PYTHON"),
                   help="an interpreter with torch + transformers for the baseline (or GPT2_MAX_HF_PYTHON)")
    p.add_argument("--llama-cpp", type=Path, default=os.environ.get("GPT2_MAX_LLAMA_CPP"), metavar="BIN_DIR",
                   help="llama.cpp's build/bin folder (llama-bench, llama-quantize), the second baseline "
                        "(or GPT2_MAX_LLAMA_CPP; default: what `python -m bench.llama_cpp setup` built, if it did)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure this project and llama.cpp N times, alternated, and report medians across the "
                        "rounds plus each round's ratio (this machine's speed drifts 20%% between minutes; "
                        "default: 1)")
    p.add_argument("--cold-compile", action="store_true",
                   help="also measure each precision's first run with empty caches (MAX's and this project's, as a "
                        "new user has them): compile, start to first token, peak memory; minutes each")
    p.add_argument("--json", type=Path, default=Path("bench-results.json"), help="where to write the results")
    p.add_argument("--linear", default="custom", choices=LINEARS,
                   help="float32 on the CPU: this project's few-rows Mojo kernel (custom, the app's default) "
                        "or step 04's nn.Linear (course, `generate --linear course`)")
    p.add_argument("--no-replay", dest="replay", action="store_false",
                   help="on a GPU: decode with plain graph calls over the in-place cache, as `generate --no-replay` "
                        "(default: each step replayed from a device graph captured at the first)")
    p.add_argument("--hf-modes", nargs="+", choices=HF_MODES, default=None,
                   help="Hugging Face's ways of decoding to measure: eager (generate with its dynamic cache) and "
                        "compiled (a static cache and torch.compile(mode='reduce-overhead'), CUDA graphs on a GPU) "
                        "(default: both on a GPU, eager on the CPU)")
    p.add_argument("--worker", metavar="DTYPE", help=argparse.SUPPRESS)  # one precision, JSON on stdout
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(measure_ours(Path(args.model), args.worker, args.device, args.reps, args.new_tokens,
                                      linear=args.linear, replay=args.replay)))
        return 0
    from model.device import DeviceError, bfloat16_fault, choose

    try:
        on_gpu = choose(args.device, "float32").kind == "gpu"  # --device auto: what this machine has
    except DeviceError as exc:  # --device gpu where MAX sees none: refused before a checkpoint is read or written
        p.error(str(exc))
    if args.model:
        from weights import resolve_model

        folder = resolve_model(args.model)
    else:
        folder = random_checkpoint(args.size)
    fault = bfloat16_fault() if on_gpu else None
    if fault and "bfloat16" in (args.dtypes or []):
        p.error(fault)  # a precision the app refuses on a GPU is not measured either
    if args.dtypes is None:
        args.dtypes = ["float32", *([] if fault else ["bfloat16"])] if on_gpu else ["float32", *QUANTIZED_DTYPES]
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    from bench import llama_cpp

    args.llama_cpp = args.llama_cpp or llama_cpp.built()
    if not args.llama_cpp:
        print("llama.cpp baseline skipped: no --llama-cpp / GPT2_MAX_LLAMA_CPP (python -m bench.llama_cpp setup "
              "builds it)", file=sys.stderr)
    rounds, failed = [], []
    for number in range(args.rounds):
        if args.rounds > 1:
            print(f"round {number + 1} of {args.rounds}", file=sys.stderr, flush=True)
        ours = []
        for dtype in args.dtypes:
            try:
                result = measure_ours_in_child(folder, dtype, args.device, args.reps, args.new_tokens, args.linear,
                                               replay=args.replay)
            except RuntimeError as exc:  # one precision failing must not lose the others
                print(f"failed: {exc}", file=sys.stderr)
                failed.append(str(exc))  # "<dtype>: <its last error line>"
                continue
            if args.cold_compile and number == 0:
                try:
                    result.update(cold_start(folder, dtype, args.device, args.linear))
                except RuntimeError as exc:  # the warm figures stand
                    print(f"failed: {exc}", file=sys.stderr)
                    failed.append(str(exc))
            ours.append(result)
        llama = []
        if args.llama_cpp:
            try:
                llama = llama_cpp.measure(Path(args.llama_cpp), folder, args.reps, args.new_tokens,
                                          precisions={SAME_PRECISION[d] for d in args.dtypes if d in SAME_PRECISION})
            except (OSError, RuntimeError, SystemExit, json.JSONDecodeError) as exc:
                print(f"llama.cpp baseline failed ({exc}); skipped", file=sys.stderr)
        rounds.append((ours, llama))
    ours = merge_rounds([o for o, _ in rounds])
    llama = merge_rounds([ll for _, ll in rounds]) or None
    hf = []
    if args.hf_python:
        device = ours[0]["device"] if ours else args.device  # what --device auto became
        # On a GPU, HF at each precision measured (torch has float32 and bfloat16); on the CPU, float32.
        hf_dtypes = [d for d in args.dtypes if d in ("float32", "bfloat16")] if device == "gpu" else ["float32"]
        modes = args.hf_modes or (HF_MODES if device == "gpu" else ["eager"])
        for dtype in hf_dtypes or ["float32"]:
            for mode in modes:
                try:
                    hf.append(measure_hf(args.hf_python, folder, args.reps, args.new_tokens, device, dtype, mode))
                except (OSError, RuntimeError, json.JSONDecodeError) as exc:
                    print(f"Hugging Face baseline ({dtype}, {mode}) failed ({exc}); skipped", file=sys.stderr)
    else:
        print("Hugging Face baseline skipped: no --hf-python / GPT2_MAX_HF_PYTHON with torch", file=sys.stderr)
    card = None
    if (ours and ours[0]["device"] == "gpu") or any(h.get("device") == "cuda" for h in hf):
        card = card_read_gb_s()
        for r in [*ours, *hf]:
            if r.get("weight_gb_s") and card:
                r["card_share_pct"] = 100 * r["weight_gb_s"] / card
    machine = {"cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
               "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}
    across = f"; each figure the median of {args.rounds} rounds' medians" if args.rounds > 1 else ""
    print(f"machine: {machine['cpu_count']} cores, {machine['memory_gb']} GiB, {machine['machine']}; "
          f"model: {folder.name}; medians of {args.reps}{across}")
    if card:
        print(f"the card reads {card:.0f} GB/s (bench.bandwidth's MAX reduction over {CARD_GIB} GiB, the best of "
              "5): the weights' reads at decode batch 1 are given as a share of it")
    print(table(ours, hf, llama))
    if args.rounds > 1:
        print("\n".join(["", *round_ratios(rounds)]))
    for line in dict.fromkeys(failed):  # once, whatever the rounds
        print(f"not measured: {line}")
    args.json.write_text(json.dumps({"machine": machine, "model": str(folder), "card_read_gb_s": card,
                                     "ours": ours, "hf": hf,
                                     "llama_cpp": llama, "failed": failed,
                                     "rounds": [{"ours": o, "llama_cpp": ll} for o, ll in rounds]}, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
