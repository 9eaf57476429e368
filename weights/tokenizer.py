"""GPT-2's byte-level BPE tokenizer, from the checkpoint folder's files."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from weights.errors import WeightsError


def load_tokenizer(folder: Path, config=None):
    """A transformers GPT-2 tokenizer for ``folder``, checked after loading.

    transformers can build an *empty* tokenizer without complaint when the
    vocabulary files are missing (it then encodes everything to []), so the
    vocabulary size is compared with the config's. Kept per folder for the
    process (the command line checks prompts with it before loading the model,
    which then needs it again)."""
    return _load_tokenizer(Path(folder).resolve(), None if config is None else config.vocab_size)


@functools.lru_cache(maxsize=4)
def _load_tokenizer(folder: Path, vocab_size: int | None):
    if not ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()) \
            and not (folder / "tokenizer.json").is_file():
        raise WeightsError(f"{folder}: no tokenizer files (vocab.json and merges.txt, or tokenizer.json)")
    try:
        # Only the tokenizer is used, never torch: transformers' "PyTorch was
        # not found" advice (5.12) is noise here.
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        from transformers import GPT2TokenizerFast

        # from_pretrained, not GPT2TokenizerFast(vocab_file=...): in transformers
        # 5.x the keyword form silently builds an empty tokenizer.
        tokenizer = GPT2TokenizerFast.from_pretrained(str(folder))
    except Exception as exc:  # transformers raises many kinds for a bad file
        first = (str(exc).strip().splitlines() or [""])[0]
        raise WeightsError(f"{folder}: tokenizer files unreadable ({type(exc).__name__}: {first})") from None
    size = len(tokenizer)
    # A model may have more rows than the tokenizer has tokens: nanoGPT pads
    # GPT-2's 50257 to 50304 (a multiple of 64). Those ids are never sampled
    # (model/generate.py). Fewer rows than tokens cannot work.
    if size < 2 or (vocab_size is not None and size > vocab_size):
        want = f"at most config.json's vocab_size {vocab_size}" if vocab_size is not None else "a real vocabulary"
        raise WeightsError(f"{folder}: the tokenizer has {size} tokens, expected {want}")
    return tokenizer
