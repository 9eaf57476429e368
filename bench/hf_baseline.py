"""The Hugging Face side of the benchmark: transformers + torch, KV cache,
greedy `generate`, float32 on the CPU, float32 or bfloat16 on a CUDA GPU. Run
by bench/__main__.py in an interpreter that has torch (torch is not a
dependency of this project); prints one JSON object.

Two ways of decoding, as Hugging Face offers them: ``eager`` (`generate`
with its default dynamic cache, each step's kernels launched by Python) and
``compiled`` (HF's fast generation path: a static cache,
``cache_implementation="static"``, and the forward compiled by
``torch.compile(mode="reduce-overhead")``, which on a CUDA GPU replays each
step as a CUDA graph). On the CPU HF compiles only when told to (its
``compile_config``), so the compiled mode runs there too, without CUDA
graphs. The prefill figures are the eager forward's in both.

    python bench/hf_baseline.py FOLDER --reps 3 --new-tokens 128
    python bench/hf_baseline.py FOLDER --device cuda --dtype bfloat16
    python bench/hf_baseline.py FOLDER --device cuda --mode compiled
"""

from __future__ import annotations

import argparse
import json
import time

PROCESS_START = time.perf_counter()

import hf_sys_path  # noqa: E402, F401  (bench/hf_sys_path.py: before transformers)
import torch  # noqa: E402
from measure import peak_rss_mb, timed  # noqa: E402  (bench/measure.py)
from transformers import GPT2LMHeadModel  # noqa: E402

MODES = ("eager", "compiled")


def generate_options(mode: str, device: str) -> dict:
    """`generate`'s keywords for ``mode`` beyond greedy decoding: for
    ``compiled``, the static cache and the compile HF's generation documents
    (``torch.compile(mode="reduce-overhead")`` of the forward, which HF runs
    itself for a static cache on a GPU; on the CPU only when its compile
    configuration says every device)."""
    if mode == "eager":
        return {}
    from transformers import CompileConfig

    compile_config = CompileConfig(mode="reduce-overhead")
    if device == "cpu":
        compile_config._compile_all_devices = True  # HF's own switch for compiling off a GPU
    return {"cache_implementation": "static", "compile_config": compile_config}


def compiled_graphs() -> int:
    """How many graphs torch.compile made in this process (0: nothing ran compiled)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prefill", type=int, nargs="+", default=[16, 512])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--mode", default="eager", choices=MODES)
    args = p.parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    model = GPT2LMHeadModel.from_pretrained(args.folder, torch_dtype=getattr(torch, args.dtype))
    model = model.to(args.device).eval()
    load_s = time.perf_counter() - start
    vocab = model.config.vocab_size
    out = {"impl": "hf", "dtype": args.dtype, "mode": args.mode, "device": args.device, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "load_s": load_s, "prefill_ms": {}, "decode_tok_s": {}}
    if args.device == "cuda":
        out["card"] = torch.cuda.get_device_name()

    def randint(shape):
        return torch.randint(0, vocab, shape).to(args.device)

    def synced(fn):
        """A GPU runs ahead of Python: time until its work is done."""
        if args.device == "cpu":
            return fn
        return lambda: (fn(), torch.cuda.synchronize())

    with torch.inference_mode():
        model(randint((1, min(args.prefill))))
        if args.device == "cuda":
            torch.cuda.synchronize()
        out["start_to_first_token_s"] = time.perf_counter() - PROCESS_START
        for n in args.prefill:
            ids = randint((1, n))
            model(ids)  # warm-up
            out["prefill_ms"][str(n)] = 1000 * timed(synced(lambda: model(ids, use_cache=True)), args.reps)
        out["ttft_ms"] = out["prefill_ms"][str(min(args.prefill))]
        for batch in args.batches:
            ids = randint((batch, 16))
            kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                      use_cache=True, pad_token_id=0, **generate_options(args.mode, args.device))
            # Warm-up, at the full length: a static cache is sized by it, and its compile (and capture) made.
            model.generate(ids, **kw)
            total = timed(synced(lambda: model.generate(ids, **kw)), args.reps)
            prefill = timed(synced(lambda: model(ids, use_cache=True)), args.reps)
            out["decode_tok_s"][str(batch)] = batch * (args.new_tokens - 1) / max(total - prefill, 1e-9)
    out["compiled_graphs"] = compiled_graphs()
    out["peak_rss_mb"] = peak_rss_mb()
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())  # the tied head counted once
    out["weights_mb"] = weight_bytes / 2**20
    out["weight_gb_s"] = weight_bytes * out["decode_tok_s"]["1"] / 1e9 if "1" in out["decode_tok_s"] else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
