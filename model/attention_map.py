"""``python -m model.attention_map`` (``pixi run attention-map``): draw what
GPT-2's attention heads look at, as a PNG heatmap with the prompt's tokens on
both axes (row: the token that looks; column: the token it looks at).

The probabilities come from bonus step 15's ``GPT2AttentionWithWeights``: the
model is the course's GPT2LMHeadModel with each block's attention swapped for
that class before the weights are loaded (the parameter names are the same),
then compiled into a MAX graph.

Why fixed lengths: with a *symbolic* sequence length, MAX 26.7 compiled
``softmax(scores + causal_mask)`` wrongly when the softmax itself is a graph
output: the mask was dropped (measured: every row a softmax over all keys;
eager and static-shape graphs were right, and so is the app, whose softmax
only feeds ``@ v``). So the prompt is padded on the right to a fixed length
(64, 128, ... up to n_positions; one graph each, cached on disk by MAX) and
the first rows and columns are kept: under the causal mask, tokens after the
prompt change nothing before them.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from model.device import DEVICES, DeviceError, Placement, choose
from weights import WeightsError, load_state, load_tokenizer, read_config, resolve_model

EXIT_USAGE = 2
DPI = 100
PANEL_INCHES = 3.2  # one head of the grid
SINGLE_INCHES = 6.4  # one head alone
GRID_COLUMNS = 4
MIN_LENGTH = 64  # prompts are padded to 64, 128, ... tokens (see above)

EXAMPLES = """examples:
  python -m model.attention_map "The cat sat on the mat because it was tired"
  python -m model.attention_map --layer 5 --head 1 "When Mary and John went to the store, John gave"
  python -m model.attention_map --model ./my-gpt2 --head all --out heads.png "Hello world"

Prints the path of the PNG it wrote. Exit status: 0 done, 2 bad input (one line on stderr)."""


class UsageError(Exception):
    pass


@dataclass
class AttentionModel:
    """A GPT-2 compiled to return every layer's attention probabilities."""

    config: object
    tokenizer: object
    probe: object = field(repr=False)
    placement: Placement
    graphs: dict = field(default_factory=dict, repr=False)  # padded length -> compiled

    def padded_length(self, seq: int) -> int:
        length = MIN_LENGTH
        while length < seq:
            length *= 2
        return min(length, self.config.n_positions)

    def probabilities(self, ids: list[int]) -> np.ndarray:
        """[n_layer, n_head, seq, seq] float32 for one prompt."""
        from max.driver import CPU
        from max.dtype import DType
        from max.experimental.tensor import Tensor
        from max.graph import TensorType

        seq = len(ids)
        length = self.padded_length(seq)
        if length not in self.graphs:
            ids_type = TensorType(DType.int64, [1, length], device=self.placement.max_device())
            self.graphs[length] = self.probe.compile(ids_type)
        padded = np.zeros((1, length), dtype=np.int64)
        padded[0, :seq] = ids
        t = Tensor.from_dlpack(padded)
        if self.placement.kind != "cpu":
            t = t.to(self.placement.max_device())
        outputs = self.graphs[length](t)
        return np.stack([o.to(CPU()).to_numpy()[0, :, :seq, :seq] for o in outputs])


def _probe(lm):
    """Wrap the model: ids in, one [1, n_head, seq, seq] tensor per layer out."""
    from max.experimental import nn

    from solutions.solution_08 import pre_norm_residual

    class AttentionProbe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            # GPT2Model.forward (step 10) and GPT2Block.forward (step 09),
            # keeping each attention's probabilities on the way.
            t = self.lm.transformer
            x = t.wte(ids) + t.wpe(ids.shape[1], 0)
            maps = []
            for block in t.h:
                out, _, _, weights = block.attn(block.ln_1(x), return_weights=True)
                x = pre_norm_residual(x + out, block.ln_2, block.mlp)
                maps.append(weights)
            return tuple(maps)

    return AttentionProbe()


_LOADED: dict[tuple[str, str], AttentionModel] = {}


def load_attention_model(model: str | Path, device: str = "cpu") -> AttentionModel:
    """Resolve and load (once per process and model); graphs compile on first use.
    ``model``: a hub id or a folder (as ``resolve_model`` returns it)."""
    key = (str(model), device)
    if key in _LOADED:
        return _LOADED[key]
    from max.dtype import DType
    from max.experimental import functional as F
    from max.experimental.tensor import default_dtype

    from solutions.solution_01 import GPT2Config
    from solutions.solution_11 import GPT2LMHeadModel
    from solutions.solution_15 import GPT2AttentionWithWeights

    placement = choose(device, "float32")
    folder = resolve_model(str(model))
    config = read_config(folder, GPT2Config)
    tokenizer = load_tokenizer(folder, config)
    state = load_state(folder, config)
    with F.lazy(), default_dtype(DType.float32):
        lm = GPT2LMHeadModel(config)
        for block in lm.transformer.h:
            block.attn = GPT2AttentionWithWeights(config)
    lm.load_state_dict(state)
    if placement.kind != "cpu":
        lm.to(placement.max_device())
    loaded = AttentionModel(config, tokenizer, _probe(lm), placement)
    _LOADED[key] = loaded
    return loaded


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
    p.add_argument("--device", default="cpu", choices=DEVICES, help="where to run (default: cpu)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not args.prompt.strip():
            raise UsageError("the prompt is empty")
        folder = resolve_model(args.model)
        from solutions.solution_01 import GPT2Config

        heads = check_request(read_config(folder, GPT2Config), args.layer, args.head)  # before the slow part
        model = load_attention_model(folder, args.device)  # resolved once, above
        ids = model.tokenizer.encode(args.prompt)
        if len(ids) > model.config.n_positions:
            raise UsageError(f"the prompt is {len(ids)} tokens; this model reads at most {model.config.n_positions}")
        probs = model.probabilities(ids)[args.layer]
        out = args.out or Path(f"attention-L{args.layer}-{args.head}.png")
        title = f"{args.model}: {args.prompt[:60]}" + ("..." if len(args.prompt) > 60 else "")
        draw(probs, token_labels(model.tokenizer, ids), heads, args.layer, title, out)
    except (UsageError, WeightsError, DeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
