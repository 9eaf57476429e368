"""See what a step does: run it on a small fixed input, beside the solution.

    python -m checker.show 07              # pixi run show 07
    python -m checker.show 02 --png mask.png
    python -m checker.show 07 --file my_attention.py

Prints the input and output shapes and dtypes, the first values of your output
beside the solution's, the largest difference and where it is, and for steps
with a pattern (the mask, embeddings, attention weights) a small picture of
the matrix. A step with a cache (07, 09-11) runs as the app runs it: a prompt,
then one token a call through the same cache, each call compared. Exit 0
when your output matches the solution within the checker's tolerance, 1 when
it differs or your code raises (naming the TODO when it is one), 2 for a
usage error. ``pixi run sNN`` is still the verdict: it tries
many inputs and names known mistakes; ``show`` lets you look at one.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from checker import maxrun, registry
from checker.harness import ATOL, RTOL, close, describe_exception, largest_difference, load_file
from checker.skeleton import ROOT
from tasks import task_command  # the command as the learner runs tasks (pixi or tasks.py)

SMALL = maxrun.SMALL_CONFIG


@dataclass
class Shown:
    output: np.ndarray
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    picture: np.ndarray | None = None  # a 2-D matrix worth looking at (its name: checker/registry.py)
    labels: list[str] | None = None  # names for a short output (step 01)
    calls: list[tuple[str, int, int]] = field(default_factory=list)  # (call, first, end position) of a cached run


class DuringCall(Exception):
    """The learner's code raised during one call of a cached run (the cause is its exception)."""

    def __init__(self, call: str) -> None:
        super().__init__(call)
        self.call = call


# A step with a cache runs as the app runs it: the prompt in one call, then
# one token a call, each through the same cache. A cache that loses or
# misplaces the earlier keys shows in the calls after the prompt.
PROMPT, TOKENS = 5, 3


def _as_the_app_runs(call, x: np.ndarray, cache, what: str) -> Shown:
    """``call(chunk, cache)`` on ``x``'s first PROMPT positions, then on each
    later one alone, all through ``cache``; the outputs joined along the positions."""
    calls = [("the prompt", 0, PROMPT)] + [(f"the token at position {t}, {t} cached", t, t + 1)
                                            for t in range(PROMPT, PROMPT + TOKENS)]

    def run_all(*chunks):
        outputs = []
        for (label, _, _), chunk in zip(calls, chunks):
            try:
                outputs.append(call(chunk, cache))
            except Exception as exc:
                raise DuringCall(label) from exc
        return outputs

    outputs = maxrun.lazily(run_all, *(maxrun.tensor(x[:, a:b]) for _, a, b in calls), what=what)
    return Shown(np.concatenate(outputs, axis=1), {"x" if x.dtype != np.int64 else "ids": x}, calls=calls)


def _x(shape, seed=0) -> np.ndarray:
    return (0.5 + np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _ids(seq=5, vocab=SMALL["vocab_size"]) -> np.ndarray:
    return (np.arange(seq, dtype=np.int64)[None] * 7 + 3) % vocab


def _paired(mod, class_name, seed, *args):
    """``mod.class_name`` built (from its GPT2Config(**SMALL) unless args are
    given) and loaded with the random weights the solution's would get."""
    from solutions.solution_01 import GPT2Config

    reference = maxrun.build(_solution_class(class_name), *(args or (GPT2Config(**SMALL),)))
    weights = maxrun.random_weights(maxrun.parameter_shapes(reference), seed=seed)
    return maxrun.build(getattr(mod, class_name), *(args or (mod.GPT2Config(**SMALL),)), weights=weights)


def _solution_class(name):
    import importlib

    for step in ("03", "04", "05", "06", "07", "09", "10", "11", "15", "16"):
        module = importlib.import_module(f"solutions.solution_{step}")
        if name in vars(module):
            return vars(module)[name]
    raise KeyError(name)


def show_01(mod) -> Shown:
    c = mod.GPT2Config()
    names = ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "head_dim", "layer_norm_epsilon"]
    return Shown(np.array([float(getattr(c, n)) for n in names]), labels=names)


def show_02(mod) -> Shown:
    mask = maxrun.lazily(mod.causal_mask, 4, 2, what="causal_mask(4, past_len=2)")
    return Shown(mask, {"seq_len": np.array(4), "past_len": np.array(2)}, mask)


def show_03(mod) -> Shown:
    w = maxrun.random_weights({"weight": [8], "bias": [8]}, seed=3)
    x = _x((1, 3, 8), 3)
    return Shown(maxrun.run(maxrun.build(mod.LayerNorm, 8, weights=w), x), {"x": x})


def show_04(mod) -> Shown:
    x = _x((1, 3, SMALL["n_embd"]), 4)
    return Shown(maxrun.run(_paired(mod, "GPT2MLP", 40), x), {"x": x})


def show_05(mod) -> Shown:
    w = maxrun.random_weights({"weight": [SMALL["vocab_size"], 8]}, seed=5)
    ids = _ids(6)
    out = maxrun.run(maxrun.build(mod.TokenEmbedding, SMALL["vocab_size"], 8, weights=w), ids)
    return Shown(out, {"ids": ids}, out[0])


def show_06(mod) -> Shown:
    w = maxrun.random_weights({"weight": [SMALL["n_positions"], 8]}, seed=6)
    module = maxrun.build(mod.PositionEmbedding, SMALL["n_positions"], 8, weights=w)
    out = maxrun.lazily(module, 5, 2, what="PositionEmbedding(seq_len=5, past_len=2)")
    return Shown(out, {"seq_len": np.array(5), "past_len": np.array(2)}, out)


def _attention_picture(module, x) -> np.ndarray:
    """Head 0's attention weights, through the module's own methods."""
    from max.experimental import functional as F

    def weights(t):
        E = t.shape[-1]
        q, k, _ = F.split(module.c_attn(t), [E, E, E], axis=-1)
        from solutions.solution_02 import causal_mask

        seq = t.shape[1]
        return module.attention_weights(module._split_heads(q), module._split_heads(k),
                                        causal_mask(seq, 0, dtype=t.dtype, device=t.device))

    return maxrun.lazily(weights, maxrun.tensor(x), what="attention_weights")[0, 0]


def show_07(mod) -> Shown:
    x = _x((1, PROMPT + TOKENS, SMALL["n_embd"]), 7)
    module = _paired(mod, "GPT2MultiHeadAttention", 7)
    shown = _as_the_app_runs(module, x, mod.ConcatCache(), "GPT2MultiHeadAttention")
    shown.picture = _attention_picture(module, x[:, :PROMPT])
    return shown


def show_08(mod) -> Shown:
    from solutions.solution_03 import LayerNorm

    norm = maxrun.build(LayerNorm, SMALL["n_embd"], weights=maxrun.random_weights(
        {"weight": [SMALL["n_embd"]], "bias": [SMALL["n_embd"]]}, seed=8))
    import solutions.solution_04 as solution_04

    mlp = _paired(solution_04, "GPT2MLP", 80)  # the solution's MLP: only the wiring is yours
    x = _x((1, 3, SMALL["n_embd"]), 8)
    out = maxrun.lazily(mod.pre_norm_residual, maxrun.tensor(x), norm, mlp, what="pre_norm_residual")
    return Shown(out, {"x": x})


def show_09(mod) -> Shown:
    x = _x((1, PROMPT + TOKENS, SMALL["n_embd"]), 9)
    return _as_the_app_runs(_paired(mod, "GPT2Block", 9), x, _solution_cache(), "GPT2Block")


def _solution_cache():
    """Steps 09-11 are shown with the solution's cache, as the app gives them one of its own."""
    from solutions.solution_07 import ConcatCache

    return ConcatCache()


def _caches() -> list:
    return [_solution_cache() for _ in range(SMALL["n_layer"])]


def show_10(mod) -> Shown:
    return _as_the_app_runs(_paired(mod, "GPT2Model", 10), _ids(PROMPT + TOKENS), _caches(), "GPT2Model")


def show_11(mod) -> Shown:
    shown = _as_the_app_runs(_paired(mod, "GPT2LMHeadModel", 11), _ids(PROMPT + TOKENS), _caches(),
                             "GPT2LMHeadModel")
    shown.picture = shown.output[0, :PROMPT]  # the prompt's rows, as the book draws them
    return shown


def show_12(mod) -> Shown:
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    picks = [mod.sample_next_token(logits, 1.0, rng) for _ in range(2000)]
    freq = np.bincount(picks, minlength=len(logits))[: len(logits)] / len(picks)
    greedy = mod.generate(lambda ids: np.eye(11, dtype=np.float32)[(ids[-1] * 7 + len(ids)) % 11], [1, 2], 6)
    out = np.concatenate([[mod.sample_next_token(logits, 0.0, rng)], np.round(freq, 2), greedy]).astype(np.float64)
    return Shown(out, {"logits": logits},
                 labels=["greedy pick", *[f"p(token {i}) at T=1" for i in range(len(logits))],
                         *[f"generate: token {i}" for i in range(len(greedy))]])


def show_13(mod) -> Shown:
    rng = np.random.default_rng(13)
    Q, K, V = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(3))
    return Shown(np.asarray(mod.multi_head_attention(Q, K, V, 2), dtype=np.float32), {"Q": Q, "K": K, "V": V})


def show_14(mod) -> Shown:
    rng = np.random.default_rng(14)
    w = [(rng.standard_normal((8, 8)) / np.sqrt(8)).astype(np.float32) for _ in range(4)]
    x = _x((1, 3, 8), 14)
    out = maxrun.lazily(mod.post_ln_attention_block, *map(maxrun.tensor, (x, *w)), 2, what="post_ln_attention_block")
    return Shown(out, {"x": x, "w_q": w[0]})


def show_15(mod) -> Shown:
    x = _x((1, 5, SMALL["n_embd"]), 15)
    module = _paired(mod, "GPT2AttentionWithWeights", 15)
    probs = maxrun.run(module, x, return_weights=True, what="forward")[1]  # (output, weights)
    return Shown(probs, {"x": x}, probs[0, 0])


def show_16(mod) -> Shown:
    x = _x((1, 4, 16), 16)
    positions = np.arange(3, 7, dtype=np.int64)
    module = _paired(mod, "RotaryCausalSelfAttention", 16, 16, 2)
    return Shown(maxrun.run(module, x, positions), {"x": x, "positions": positions})


def shows() -> dict:
    """Step -> its show function (``show_NN`` above), for every step of checker/registry.py that has one."""
    found = {step.number: globals().get(f"show_{step.number}") for step in registry.STEPS}
    return {number: function for number, function in found.items() if function is not None}


SHOWS = shows()


def picture(matrix: np.ndarray, width: int = 8) -> str:
    """A few rows of a matrix as text: -inf as ' -inf', others to 2 decimals."""
    rows = []
    for row in np.asarray(matrix)[:width]:
        cells = ["  -inf" if np.isneginf(v) else f"{v:6.2f}" for v in row[:width]]
        rows.append(" ".join(cells) + (" ..." if len(row) > width else ""))
    return "\n".join("    " + r for r in rows)


def side_by_side(yours: np.ndarray, solution: np.ndarray, width: int = 8) -> str:
    """``picture`` of both matrices, the solution's rows beside yours: a
    saturated row (1.00 / 0.00) or a shifted diagonal shows at a glance."""
    left = [line[4:] for line in picture(yours, width).splitlines()]
    right = [line[4:] for line in picture(solution, width).splitlines()]
    pad = max([len("yours"), *map(len, left)])
    rows = [f"{'yours':<{pad}}   | solution"]
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else ""
        b = right[i] if i < len(right) else ""
        rows.append(f"{a:<{pad}}   | {b}")
    return "\n".join("    " + r for r in rows)


def first(values: np.ndarray, n: int = 6) -> str:
    flat = np.asarray(values, dtype=np.float64).ravel()[:n]
    return ("[" + ", ".join("-inf" if np.isneginf(v) else f"{v:.4f}" for v in flat)
            + (", ...]" if values.size > n else "]"))


def describe(a: np.ndarray) -> str:
    return f"shape {list(a.shape)} {a.dtype}"


def compare(got: np.ndarray, want: np.ndarray) -> tuple[bool, str]:
    """The checker's tolerance (harness.close), and a NaN never matches."""
    if got.shape != want.shape:
        return False, f"shapes differ: yours {list(got.shape)}, the solution's {list(want.shape)}"
    if not got.size:
        return True, "empty output"
    ok = close(got, want) and not np.isnan(got.astype(np.float64)).any()
    worst, where = largest_difference(got, want)
    index = ", ".join(map(str, where))
    return ok, f"largest difference {worst:.3g} at [{index}] (yours {got[where]:.5g}, solution {want[where]:.5g})"


def main(argv: list[str] | None = None) -> int:
    """``show`` with MAX's on-the-fly compiles collected (as the checker does):
    one note at the end when they cost time, none of MAX's own lines per kernel."""
    since = len(maxrun.COMPILED)
    maxrun.collect_compiles()
    try:
        return show(argv)
    finally:
        note = maxrun.compile_note(since)
        if note:
            print(f"  note: {note}")


def show(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m checker.show", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", help=f"step number ({registry.numbers()})")
    p.add_argument("--file", type=Path, default=None, help="show this file as the step (default: steps/step_NN.py)")
    p.add_argument("--png", type=Path, default=None, help="also draw the step's matrix to this PNG")
    args = p.parse_args(argv)
    step = args.step.zfill(2)
    if registry.find(step) is None:
        print(f"show: no step {args.step!r}; steps are {registry.numbers()}", file=sys.stderr)
        return 2
    if step not in SHOWS:
        print(f"show: step {step} has nothing to show yet; `{task_command('s' + step)}` checks it", file=sys.stderr)
        return 2
    path = args.file or ROOT / "steps" / f"step_{step}.py"
    if not path.is_file():
        print(f"show: {path} not found", file=sys.stderr)
        return 2
    import importlib

    from model.course import imported_steps, steps_needed, unfinished_steps

    # An earlier step this file runs that is still a TODO would fail the
    # learner's run anyway: say so now, before the solution's kernels compile
    # (minutes on a cold cache).
    uses = steps_needed(*imported_steps(path))
    earlier = unfinished_steps(*uses)
    if earlier:
        uses = ", ".join(uses)
        todo = ", ".join(f"steps/step_{n}.py (line {line})" for n, line in earlier)
        print(f"Step {step} runs your steps {uses}; still TODO: {todo}.\n"
              f"  hint: finish them first, in order: {', '.join(task_command('s' + n) for n, _ in earlier)}")
        return 1
    with maxrun.slow_notice(f"show {step} (the solution's run, then yours)"):
        solution = SHOWS[step](importlib.import_module(f"solutions.solution_{step}"))
    print(f"Step {step} ({path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}) on its fixed input:")
    for name, value in solution.inputs.items():
        print(f"  input {name}: {describe(value)}"
              + (f" = {value.tolist()}" if value.size <= 8 else f"  {first(value)}"))
    if solution.calls:
        print(f"  run as the app runs it: the prompt ({PROMPT} positions), then {TOKENS} tokens one at a time, "
              f"each call through the same cache")
    try:
        with maxrun.interpreter(), maxrun.slow_notice(f"show {step} (your run)"):
            learner = SHOWS[step](load_file(path, f"show_step_{step}"))
    except Exception as exc:  # the learner's code raised: say where, as the checker does
        during = ""
        if isinstance(exc, DuringCall):
            during, exc = f" in the call for {exc.call}", exc.__cause__
        message, hint = describe_exception(exc, path)
        print(f"  your code raised{during}: " + message.strip().replace("\n", "\n    ") + f"\n  hint: {hint}")
        print(f"  the solution gives: {describe(solution.output)} {first(solution.output)}")
        return 1
    got, want = np.asarray(learner.output), np.asarray(solution.output)
    print(f"  output: yours {describe(got)}, the solution's {describe(want)}")
    if solution.labels:
        for i, label in enumerate(solution.labels):
            mine = got.ravel()[i] if i < got.size else float("nan")
            print(f"    {label:<24} yours {mine:<12.6g} solution {want.ravel()[i]:.6g}")
    else:
        print(f"    yours    {first(got)}\n    solution {first(want)}")
    ok, summary = compare(got, want)
    print(f"  {summary}")
    if solution.calls and got.shape == want.shape:
        for call, begin, end in solution.calls:
            same, where = compare(got[:, begin:end], want[:, begin:end])
            print(f"    {call}: {'matches' if same else 'DIFFERS, ' + where}")
    if solution.picture is not None:
        # The name says what the solution's matrix is; the learner's side is whatever their
        # code returned from the same input (for step 06, perhaps other rows than 2..6).
        name = registry.find(step).picture
        print(f"  the solution's {name}, beside yours from the same input:")
        mine = learner.picture if learner.picture is not None else got
        print(side_by_side(mine, solution.picture))
        if args.png:
            draw({"yours, from the same input": np.asarray(mine), f"solution: {name}": np.asarray(solution.picture)},
                 args.png)
            print(f"  wrote {args.png}")
    elif args.png:
        print("  (this step has no matrix to draw; --png ignored)")
    print("  matches the solution" if ok else f"  DIFFERS from the solution (tolerance rtol {RTOL}, atol {ATOL}); "
          f"run `{task_command('s' + step)}` for the checks and hints")
    return 0 if ok else 1


def draw(panels: dict[str, np.ndarray], out: Path) -> None:
    """Each matrix side by side under its title (the dict's key); -inf (hidden) left blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, (title, m) in zip(axes[0], panels.items()):
        shown = np.where(np.isneginf(m), np.nan, m)
        wide = m.shape[1] > 4 * m.shape[0]  # logits (5 x 101): square cells would be a thin strip
        image = ax.imshow(shown, cmap="viridis", aspect="auto" if wide else "equal")
        if np.nanmax(shown) > np.nanmin(shown):  # a mask is all 0 where visible: no scale to read
            fig.colorbar(image, ax=ax, shrink=0.8)
        ax.set_title(title, fontsize=8)
        for axis in (ax.xaxis, ax.yaxis):  # rows and columns are indices: no 0.5 ticks
            axis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    maxrun.without_gpus()  # the learner's module runs on the CPU: nothing for MAX to compile for a GPU
    sys.exit(main())
