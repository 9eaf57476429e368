"""``python -m model.attention_map`` (``pixi run attention-map``): draw what
GPT-2's attention heads look at, as a PNG heatmap with the prompt's tokens on
both axes (row: the token that looks; column: the token it looks at).

The model comes from the one build, ``load_gpt2(..., attention_layer=N)``:
the course's GPT2LMHeadModel with bonus step 15's attention (step 07's math,
keeping its probabilities), compiled into the same graph as ``generate``'s
plus one output, layer N's probabilities. Only that layer's [n_head, seq,
seq] reaches the host.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from model.device import DEVICES, DeviceError
from weights import WeightsError, open_checkpoint

EXIT_USAGE = 2
DPI = 100
PANEL_INCHES = 3.2  # one head of the grid
SINGLE_INCHES = 6.4  # one head alone
GRID_COLUMNS = 4

EXAMPLES = """examples:
  python -m model.attention_map "The cat sat on the mat because it was tired"
  python -m model.attention_map --layer 5 --head 1 "When Mary and John went to the store, John gave"
  python -m model.attention_map --model ./my-gpt2 --head all --out heads.png "Hello world"
  python -m model.attention_map --impl steps --model demo "And it came to pass"   # your own attention

Prints the path of the PNG it wrote. Exit status: 0 done, 2 bad input (one line on stderr)."""


class UsageError(Exception):
    pass


_LOADED: dict[tuple[str, str, int, str], object] = {}


def load_attention_model(model, layer: int, device: str = "auto", impl: str = "solutions"):
    """``load_gpt2(model, BuildOptions(..., attention_layer=layer))``, once per
    process (the tests and a notebook draw several prompts from one model).
    ``model``: a hub id, a folder or an opened ``weights.Checkpoint``."""
    from model.gpt2 import BuildOptions, load_gpt2

    options = BuildOptions(impl=impl, device=device, attention_layer=layer)
    key = (str(getattr(model, "folder", model)), options.placement.kind, layer, impl)
    if key not in _LOADED:
        _LOADED[key] = load_gpt2(model, options)
    return _LOADED[key]


def probabilities(gpt2, ids: list[int]) -> np.ndarray:
    """[n_head, seq, seq] float32: the built layer's attention for one prompt."""
    probs, _ = gpt2.attention(np.array([ids], dtype=np.int64))
    return probs[0]


def token_labels(tokenizer, ids: list[int]) -> list[str]:
    """Each token as text, with spaces and newlines made visible."""
    return [tokenizer.decode([i]).replace(" ", "\u2423").replace("\n", "\\n") or "\u2205" for i in ids]


def check_request(config, layer: int, head: str) -> list[int]:
    """The heads to draw; UsageError for a layer or head out of range."""
    if not 0 <= layer < config.n_layer:
        raise UsageError(f"--layer {layer}: this model has {config.n_layer} layers (0-{config.n_layer - 1})")
    if head == "all":
        return list(range(config.n_head))
    try:
        h = int(head)
    except ValueError:
        raise UsageError(f"--head {head!r}: give a head number or 'all'") from None
    if not 0 <= h < config.n_head:
        raise UsageError(f"--head {h}: this model has {config.n_head} heads per layer (0-{config.n_head - 1})")
    return [h]


def figure_pixels(n_heads: int) -> tuple[int, int]:
    """(width, height) of the PNG for one head or a grid of ``n_heads``."""
    if n_heads == 1:
        side = round(SINGLE_INCHES * DPI)
        return side, side
    cols = min(GRID_COLUMNS, n_heads)
    rows = math.ceil(n_heads / cols)
    return round(cols * PANEL_INCHES * DPI), round(rows * PANEL_INCHES * DPI)


def draw(probs: np.ndarray, labels: list[str], heads: list[int], layer: int, title: str, out: Path) -> Path:
    """Write the heatmap(s) of ``probs`` [n_head, seq, seq] to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    width, height = figure_pixels(len(heads))
    cols = 1 if len(heads) == 1 else min(GRID_COLUMNS, len(heads))
    rows = math.ceil(len(heads) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width / DPI, height / DPI), dpi=DPI, squeeze=False)
    show_labels = len(labels) <= (40 if len(heads) == 1 else 16)
    font = 8 if len(heads) == 1 else 6
    for ax in axes.flat[len(heads):]:
        ax.axis("off")
    for ax, h in zip(axes.flat, heads):
        ax.imshow(probs[h], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(f"layer {layer}, head {h}", fontsize=font + 2)
        if show_labels:
            ticks = range(len(labels))
            ax.set_xticks(ticks, labels, rotation=90, fontsize=font)
            ax.set_yticks(ticks, labels, fontsize=font)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=DPI)  # no bbox_inches: the size stays width x height
    plt.close(fig)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model.attention_map",
        description="Draw GPT-2's attention probabilities for a prompt as a PNG heatmap.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", metavar="PROMPT", help="the text whose attention to draw")
    p.add_argument("--model", default="gpt2", metavar="ID_OR_DIR",
                   help="Hugging Face id or a folder with config.json, model.safetensors and tokenizer files "
                        "(default: gpt2)")
    p.add_argument("--layer", type=int, default=0, help="which layer, from 0 (default: 0)")
    p.add_argument("--head", default="all", help="a head number from 0, or 'all' for a grid (default: all)")
    p.add_argument("--out", type=Path, help="where to write the PNG (default: attention-L<layer>-<head>.png)")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto takes a GPU when MAX sees one (the CPU on macOS), as generate does (default: auto)")
    p.add_argument("--impl", default="solutions", choices=("solutions", "steps"),
                   help="whose attention: the reference solutions, or your own steps/ (01-11 and 15)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not args.prompt.strip():
            raise UsageError("the prompt is empty")
        checkpoint = open_checkpoint(args.model)  # read once: the build takes it as it is
        heads = check_request(checkpoint.config, args.layer, args.head)  # before the slow part
        if args.impl == "steps":
            from model.course import MODEL_STEPS, unfinished_message, unfinished_steps

            roots = (*MODEL_STEPS, "15")  # the attention map keeps step 15's probabilities
            unfinished = unfinished_steps(*roots)
            if unfinished:  # all of them at once, before anything compiles
                bonus = (" (step 15 is a bonus step, and the one this command needs: it keeps the attention "
                         "weights; without --impl steps the map uses the solutions)"
                         if "15" in dict(unfinished) else "")
                raise UsageError(unfinished_message(unfinished, roots) + bonus)
        gpt2 = load_attention_model(checkpoint, args.layer, args.device, args.impl)
        ids = gpt2.tokenizer.encode(args.prompt)
        if len(ids) > gpt2.config.n_positions:
            raise UsageError(f"the prompt is {len(ids)} tokens; this model reads at most {gpt2.config.n_positions}")
        probs = probabilities(gpt2, ids)
        out = args.out or Path(f"attention-L{args.layer}-{args.head}.png")
        title = f"{args.model}: {args.prompt[:60]}" + ("..." if len(args.prompt) > 60 else "")
        draw(probs, token_labels(gpt2.tokenizer, ids), heads, args.layer, title, out)
    except (UsageError, WeightsError, DeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        from model.cli import unfinished_step

        unfinished = unfinished_step(exc) if args.impl == "steps" else None
        if unfinished is None:
            raise
        print(f"error: {unfinished}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
