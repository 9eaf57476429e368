"""The bundled demo GPT-2 (`--model demo`): it loads with no network, its greedy
text is Hugging Face's, token for token, and it writes words of its training
text (tests/reference/make_demo.py made the checkpoint and the reference)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from checkpoints import demo_reference

from model.gpt2 import load_gpt2
from weights import read_config, resolve_model
from weights.resolve import DEMO

REFERENCE = Path(__file__).resolve().parent / "reference" / "demo"


@pytest.fixture(scope="module")
def demo():
    return load_gpt2("demo", device="cpu")


@pytest.fixture(scope="module")
def reference():
    return demo_reference()


def test_demo_is_bundled_and_small():
    folder = resolve_model("demo")
    assert folder == DEMO
    config = read_config(folder)
    assert config.vocab_size == 50257  # GPT-2's own vocabulary, its real BPE files beside it
    assert (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    assert (folder / "model.safetensors").stat().st_size <= 20 * 2**20
    record = json.loads((folder / "training.json").read_text())
    assert record["held_out_loss"] < record["unigram_baseline_loss"]


def test_logits_equal_hugging_faces(demo, reference):
    logits = demo.forward_logits(reference["ids"])
    assert np.abs(logits - reference["logits"]).max() <= 1e-3 * np.abs(reference["logits"]).max()


def test_greedy_equals_hugging_faces(demo, reference):
    from model.generate import generate
    from model.sampling import Sampling

    prompt = demo.tokenizer.decode(reference["prompt"][0])
    want = reference["greedy"][0].tolist()
    [result] = generate(demo, [prompt], len(want), Sampling(temperature=0.0))
    assert result.tokens == want, f"{demo.tokenizer.decode(result.tokens)!r} != {demo.tokenizer.decode(want)!r}"


def test_it_writes_words_of_its_training_text(demo):
    from model.generate import generate
    from model.sampling import Sampling

    vocabulary = set((REFERENCE / "words.txt").read_text().split())
    prompts = ["And it came to pass", "In the beginning", "The LORD is my shepherd", "Then said Jesus unto them"]
    results = generate(demo, prompts, 40, Sampling(temperature=0.8, top_k=40), seed=0)
    words = [w for r in results for w in re.findall(r"[A-Za-z]+", r.text)]
    known = sum(w in vocabulary for w in words) / len(words)
    assert len(words) > 60 and known >= 0.9, (known, [r.text for r in results])


def test_the_model_card_states_the_held_out_split_from_the_text(tmp_path):
    """The card once said the held-out 5% was "most of Revelation"; it begins 17 books earlier."""
    import shutil
    import sys

    if shutil.which("bible") is None:
        pytest.skip("the demo's text comes from Debian's bible-kjv (apt-get install bible-kjv)")
    from transformers import GPT2TokenizerFast

    from weights.synthetic import copy_gpt2_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent / "reference"))
    import kjv

    tokenizer = GPT2TokenizerFast.from_pretrained(str(copy_gpt2_tokenizer(tmp_path)))
    where, held, total = kjv.held_out_start(kjv.kjv_verses(), tokenizer)  # make_demo.py's split_index
    card = (DEMO / "MODEL_CARD.md").read_text()
    assert f"held out: from {where} to the end" in card, where
