"""A small *trained* GPT-2 for the reduced-precision tests.

Random checkpoints (make_reference.py) have unstructured weights and nearly
flat logits, so any 4-bit rounding flips their greedy picks; a real model's
are decided by clear margins. This script trains a byte-level GPT-2 (vocab
256: token = byte) with Hugging Face transformers + torch on this project's
own text (README.md and solutions/*.py, so anyone can re-run it) for a few
minutes on a CPU, and writes, under tests/reference/trained-bytes/:

  config.json, model.safetensors   the checkpoint (HF layout, save_pretrained)
  reference.npz                    ids [2, 64] and HF's logits for them; a
                                   prompt and HF's greedy continuation
                                   (generate, KV cache, 48 new tokens)
  versions.json                    torch, transformers, seed, steps, final loss

Every width is a multiple of 256, so Q4_0 (blocks of 32) and Q6_K (256)
quantize every layer. Re-run:

    /tmp/torch311/bin/python tests/reference/make_trained.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SIZES = dict(vocab_size=256, n_positions=128, n_embd=256, n_layer=2, n_head=4)
SEED, STEPS, BATCH, SEQ = 2024, 700, 16, 128
PROMPT = "The model the app runs"


def corpus() -> np.ndarray:
    files = [ROOT / "README.md", *sorted((ROOT / "solutions").glob("solution_*.py"))]
    text = "\n\n".join(f.read_text(encoding="utf-8") for f in files)
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def main() -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    data = torch.from_numpy(corpus())
    config = GPT2Config(**SIZES, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        bos_token_id=None, eos_token_id=None, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=STEPS, pct_start=0.1)
    start = time.time()
    for step in range(STEPS):
        at = torch.randint(0, len(data) - SEQ - 1, (BATCH,))
        batch = torch.stack([data[i:i + SEQ] for i in at])
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == STEPS - 1:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - start:.0f} s)", flush=True)
    model.eval()
    out = HERE / "trained-bytes"
    out.mkdir(exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    generator = torch.Generator().manual_seed(SEED + 1)
    at = torch.randint(0, len(data) - 64, (2,), generator=generator)
    ids = torch.stack([data[i:i + 64] for i in at])
    prompt = torch.tensor([list(PROMPT.encode("utf-8"))])
    with torch.no_grad():
        logits = model(ids).logits
        greedy = model.generate(prompt, max_new_tokens=48, do_sample=False, use_cache=True,
                                pad_token_id=0, eos_token_id=None)
    np.savez(out / "reference.npz", ids=ids.numpy(), logits=logits.numpy().astype(np.float32),
             prompt=prompt.numpy(), greedy=greedy[:, prompt.shape[1]:].numpy())
    (out / "versions.json").write_text(json.dumps(
        {"torch": torch.__version__, "transformers": transformers.__version__, "seed": SEED, "steps": STEPS,
         "final_loss": round(loss.item(), 3)}, indent=2) + "\n")
    text = bytes(greedy[0].tolist()).decode("utf-8", errors="replace")
    print(f"wrote {out.relative_to(ROOT)}; greedy: {text!r}")


if __name__ == "__main__":
    main()
