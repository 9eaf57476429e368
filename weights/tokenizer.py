"""GPT-2's byte-level BPE tokenizer, from the checkpoint folder's files."""

from __future__ import annotations

from pathlib import Path

from weights.errors import WeightsError


def load_tokenizer(folder: Path, config=None):
    """A transformers GPT-2 tokenizer for ``folder``, checked after loading.

    transformers can build an *empty* tokenizer without complaint when the
    vocabulary files are missing (it then encodes everything to []), so the
    vocabulary size is compared with the config's."""
    folder = Path(folder)
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    fast = folder / "tokenizer.json"
    try:
        if vocab.is_file() and merges.is_file():
            from transformers import GPT2Tokenizer

            tokenizer = GPT2Tokenizer(vocab_file=str(vocab), merges_file=str(merges))
        elif fast.is_file():
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(fast))
        else:
            raise WeightsError(f"{folder}: no tokenizer files (vocab.json and merges.txt, or tokenizer.json)")
    except WeightsError:
        raise
    except Exception as exc:  # transformers raises many kinds for a bad file
        raise WeightsError(f"{folder}: tokenizer files unreadable ({type(exc).__name__}: {exc})") from None
    size = len(tokenizer)
    if size < 2 or (config is not None and size != config.vocab_size):
        want = f"config.json's vocab_size {config.vocab_size}" if config is not None else "a real vocabulary"
        raise WeightsError(f"{folder}: the tokenizer has {size} tokens, expected {want}")
    return tokenizer
