"""A checkpoint folder, read once: the folder, its config, its tokenizer, its end-of-text ids.

    checkpoint = open_checkpoint("gpt2")     # the CLI checks the prompts with checkpoint.tokenizer ...
    gpt2 = load_gpt2(checkpoint, options)    # ... and the build reads the same objects, not the files again
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from weights.config import read_config, read_eos_token_ids
from weights.resolve import resolve_model
from weights.tokenizer import load_tokenizer


@dataclass
class Checkpoint:
    """``folder`` (resolved) and its ``config`` (step 01's GPT2Config of the
    solutions, unless another class was asked for); the tokenizer is read on
    first use."""

    folder: Path
    config: object
    _tokenizer: object = field(default=None, repr=False)

    def config_as(self, config_class) -> object:
        """The config as ``config_class`` (the learner's step 01 with ``--impl
        steps``): the one read already when it is of that class."""
        if config_class is None or type(self.config) is config_class:
            return self.config
        return read_config(self.folder, config_class)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.folder, self.config)
        return self._tokenizer

    def eos_token_ids(self, with_tokenizer: bool = True) -> tuple[int, ...]:
        """The ids that end generation: generation_config.json's, else the tokenizer's."""
        ids = read_eos_token_ids(self.folder)
        if ids:
            return tuple(ids)
        return (self.tokenizer.eos_token_id,) if with_tokenizer else ()


def open_checkpoint(model: str | Path | Checkpoint, config_class=None) -> Checkpoint:
    """A hub id, a folder or ``demo`` -> its Checkpoint (``WeightsError`` names what is wrong)."""
    if isinstance(model, Checkpoint):
        return model
    folder = resolve_model(str(model))
    return Checkpoint(folder, read_config(folder, config_class))
