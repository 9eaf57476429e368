"""Checkpoints for the tests: the synthetic ones of weights/synthetic.py, and
the reference ones made by tests/reference/make_reference.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from weights.checkpoint import read_safetensors
from weights.synthetic import copy_gpt2_tokenizer, hf_config, random_hf_state, write_checkpoint

__all__ = ["TINY", "copy_gpt2_tokenizer", "demo_reference", "greedy", "hf_config", "learner_tree", "random_hf_state",
           "reference", "reference_variant", "write_checkpoint"]

REFERENCE = Path(__file__).resolve().parent / "reference"

# The synthetic checkpoint's shapes the app, attention-map, bench and model tests
# share (vocab_size 50257: GPT-2's real tokenizer fits it). MAX keys a compiled
# graph by what it computes, not by its weights: one shape, one compile per machine.
TINY = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)


def reference(name: str) -> tuple[Path, dict, dict[str, np.ndarray]]:
    """A reference checkpoint folder, its sizes and its reference arrays."""
    folder = REFERENCE / name
    config = json.loads((folder / "config.json").read_text())
    sizes = {k: config[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")}
    with np.load(folder / "reference.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return folder, sizes, arrays


def demo_reference() -> dict[str, np.ndarray]:
    """HF's reference arrays for the bundled demo (made by make_demo.py; the
    checkpoint itself is weights/demo)."""
    with np.load(REFERENCE / "demo" / "reference.npz") as data:
        return {k: data[k] for k in data.files}


def reference_variant(name: str, folder: Path, *, prefix: bool, lm_head: bool, buffers: bool = False) -> Path:
    """The reference checkpoint rewritten with or without the prefix and head."""
    source, sizes, _ = reference(name)
    state = {n: np.ascontiguousarray(a) for n, a in read_safetensors(source / "model.safetensors").items()}
    state = {n if n.startswith(("transformer.", "lm_head")) else "transformer." + n: a for n, a in state.items()}
    state.pop("lm_head.weight", None)
    return write_checkpoint(folder, sizes, state, prefix=prefix, lm_head=lm_head, buffers=buffers)


def greedy(gpt2, prompt: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` greedy tokens after ``prompt`` [batch, seq], one ``step`` each:
    the tokens [batch, n] and every step's logits [batch, n + 1, vocab]."""
    logits, cache = gpt2.step(prompt, gpt2.empty_cache(len(prompt)))
    tokens, steps = [], [logits]
    for _ in range(n):
        tokens.append(logits.argmax(-1))
        logits, cache = gpt2.step(tokens[-1][:, None], cache)
        steps.append(logits)
    return np.stack(tokens, 1), np.stack(steps, 1)


def learner_tree(tmp_path: Path, finished: bool) -> tuple[Path, dict[str, str]]:
    """A folder holding a `steps` package: untouched skeletons, or every step
    finished (the solutions, importing each other as steps.step_NN); and an
    environment whose PYTHONPATH is the repository first, so a child run with
    the folder as its current directory imports that `steps`."""
    import os
    import re

    from conftest import pythonpath

    from checker.skeleton import ROOT, make_skeleton, solutions, step_id

    steps = tmp_path / "learner" / "steps"
    steps.mkdir(parents=True)
    (steps / "__init__.py").write_text("")
    for solution in solutions():
        text = solution.read_text()
        if finished:
            text = re.sub(r"\bsolutions\.solution_", "steps.step_", text)
        else:
            text = make_skeleton(text, step_id(solution))
        (steps / f"step_{step_id(solution)}.py").write_text(text)
    env = dict(os.environ, PYTHONPATH=pythonpath(ROOT))
    return steps.parent, env


# Two changes a learner might make to step 07: a forward without c_proj, and an
# _attn that scales its output. Each must reach the model the app runs.
STEP_07_EDITS = {
    "forward-without-c_proj": ("return self.c_proj(self._merge_heads(cache.attend(q, k, v, self._attn)))",
                               "return self._merge_heads(cache.attend(q, k, v, self._attn))"),
    "_attn-scaled": ("return self.attention_weights(q, k, mask) @ v",
                     "return (self.attention_weights(q, k, mask) @ v) * 2.0"),
}


def traced_digest_in(cwd: Path, env: dict[str, str] | None, folder: Path, impl: str, served: bool = False) -> str:
    """The digest of the graph the app (or, ``served``, the server) compiles
    for ``folder`` from ``impl`` on the CPU, traced and not compiled (seconds,
    where a compile costs minutes), in a child run from ``cwd`` with ``env``
    (this process's when None): a learner's tree there is the ``steps`` it imports."""
    import os
    import subprocess
    import sys

    digest = (f"from maintain.server_targets import served_digest; print(served_digest({str(folder)!r}, options))"
              if served
              else "from model.course import config_class; from maintain.app_graphs import traced_digest\n"
                   "from weights import open_checkpoint\n"
                   f"config = open_checkpoint({str(folder)!r}).config_as(config_class(options.impl))\n"
                   "print(traced_digest(options, config))")
    code = ("from model.options import BuildOptions\n"
            f"options = BuildOptions(impl={impl!r}, device='cpu', dtype='float32')\n" + digest)
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=dict(os.environ) if env is None else env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def edited_learner_tree(tmp_path, edit: tuple[str, str]):
    """A finished learner tree whose steps/step_07.py has ``edit`` made."""
    cwd, env = learner_tree(tmp_path, finished=True)
    step = cwd / "steps" / "step_07.py"
    text = step.read_text()
    assert edit[0] in text, "step 07's solution changed: update STEP_07_EDITS"
    step.write_text(text.replace(*edit))
    return cwd, env
