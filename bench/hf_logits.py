"""Hugging Face's logits and greedy tokens for one checkpoint, at a precision
and on a device of torch's: the reference bench/accuracy.py compares with when
given --hf-python (bfloat16 on a GPU against HF's bfloat16 on the same card).
Run in an interpreter that has torch (not a dependency of this project).

    python bench/hf_logits.py FOLDER INPUT.npz OUTPUT.npz --device cuda --dtype bfloat16

INPUT.npz holds ``ids`` (batch x positions) and ``prompt`` (1 x positions)
and ``new_tokens``; OUTPUT.npz gets ``logits`` (float32) and ``greedy``.
"""

from __future__ import annotations

import argparse

import hf_sys_path  # noqa: F401  (bench/hf_sys_path.py: before transformers)
import numpy as np
import torch
from transformers import GPT2LMHeadModel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()
    model = GPT2LMHeadModel.from_pretrained(args.folder, torch_dtype=getattr(torch, args.dtype))
    model = model.to(args.device).eval()
    with np.load(args.input) as data:
        ids, prompt, new_tokens = data["ids"], data["prompt"], int(data["new_tokens"])
    with torch.inference_mode():
        logits = model(torch.from_numpy(ids).to(args.device)).logits.float().cpu().numpy()
        prompt = torch.from_numpy(prompt).to(args.device)
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=0, attention_mask=torch.ones_like(prompt))
    np.savez(args.output, logits=logits, greedy=out[:, prompt.shape[1]:].cpu().numpy())


if __name__ == "__main__":
    main()
