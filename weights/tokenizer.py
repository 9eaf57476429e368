"""GPT-2's byte-level BPE tokenizer, from the checkpoint folder's files.

Built on the ``tokenizers`` library (the Rust engine under transformers' fast
tokenizers) rather than transformers itself: importing transformers took
1.2 s of a 3.5 s start here, the tokenizer 0.1 s. ``tests/test_weights.py``
checks it gives transformers' ``GPT2TokenizerFast`` ids and text on awkward
strings (Unicode, whitespace runs, newlines, the end token).
"""

from __future__ import annotations

import functools
from pathlib import Path

from weights.errors import WeightsError

EOS = "<|endoftext|>"


class GPT2Tokenizer:
    """The little of a tokenizer the app uses: encode, decode, len, eos."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.token_to_id(EOS)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def decode(self, ids) -> str:
        # Special tokens are shown, as transformers' decode shows them by default.
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)


def load_tokenizer(folder: Path, config=None) -> GPT2Tokenizer:
    """GPT-2's tokenizer for ``folder`` (tokenizer.json, else vocab.json +
    merges.txt), its size checked against the config's vocabulary. Kept per
    folder for the process (the command line checks prompts with it before
    loading the model, which then needs it again)."""
    return _load_tokenizer(Path(folder).resolve(), None if config is None else config.vocab_size)


@functools.lru_cache(maxsize=4)
def _load_tokenizer(folder: Path, vocab_size: int | None) -> GPT2Tokenizer:
    vocab, merges, whole = folder / "vocab.json", folder / "merges.txt", folder / "tokenizer.json"
    if not (vocab.is_file() and merges.is_file()) and not whole.is_file():
        raise WeightsError(f"{folder}: no tokenizer files (vocab.json and merges.txt, or tokenizer.json)")
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        if whole.is_file():
            tokenizer = Tokenizer.from_file(str(whole))
        else:
            # What transformers' GPT2TokenizerFast builds from the same two files.
            tokenizer = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tokenizer.decoder = decoders.ByteLevel()
            tokenizer.add_special_tokens([AddedToken(EOS, special=True)])
    except Exception as exc:  # tokenizers raises several kinds for a bad file
        first = (str(exc).strip().splitlines() or [""])[0]
        raise WeightsError(f"{folder}: tokenizer files unreadable ({type(exc).__name__}: {first})") from None
    wrapped = GPT2Tokenizer(tokenizer)
    size = len(wrapped)
    # A model may have more rows than the tokenizer has tokens: nanoGPT pads
    # GPT-2's 50257 to 50304 (a multiple of 64). Those ids are never sampled
    # (model/generate.py). Fewer rows than tokens cannot work.
    if size < 2 or (vocab_size is not None and size > vocab_size):
        want = f"at most config.json's vocab_size {vocab_size}" if vocab_size is not None else "a real vocabulary"
        raise WeightsError(f"{folder}: the tokenizer has {size} tokens, expected {want}")
    return wrapped
