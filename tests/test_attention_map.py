"""`python -m model.attention_map`: attention probabilities from the one build
(bonus step 15's class, an extra output of the generate graph) against the
numpy oracle, and the PNG it draws. Every test draws layer 1, so the suite
compiles one attention graph."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from checkpoints import TINY as SIZES
from checkpoints import write_checkpoint
from conftest import pythonpath, run_python

from checker import oracle
from checker.oracle_attention import attention_probs
from model import caches
from model.attention_map import figure_pixels, load_attention_model, main, probabilities
from model.generate import generate
from model.gpt2 import load_gpt2
from model.sampling import Sampling
from weights import load_state, read_config

LAYER = 1
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("amap") / "tiny-gpt2", SIZES, tokenizer=True, seed=5)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", "not a PNG file"
    return struct.unpack(">II", data[16:24])


def oracle_probs(folder, ids: list[int]) -> np.ndarray:
    w = load_state(folder, read_config(folder))
    p, h = "transformer.", SIZES["n_head"]
    x = w[p + "wte.weight"][np.array([ids])] + w[p + "wpe.weight"][: len(ids)]
    layers = []
    for i in range(SIZES["n_layer"]):
        pre = f"{p}h.{i}."
        normed = oracle.layer_norm(x, w[pre + "ln_1.weight"], w[pre + "ln_1.bias"])
        qkv = oracle.linear(normed, w[pre + "attn.c_attn.weight"], w[pre + "attn.c_attn.bias"])
        q, k, _ = (oracle.split_heads(m, h) for m in np.split(qkv, 3, axis=-1))
        layers.append(attention_probs(q, k, oracle.causal_mask(len(ids)))[0])
        x = oracle.block(x, w, h, pre)[0]
    return np.stack(layers)


def test_probabilities_match_the_oracle(folder):
    model = load_attention_model(folder, LAYER, "cpu")
    ids = model.tokenizer.encode("The cat sat on the mat because it was tired")
    probs = probabilities(model, ids)
    assert probs.shape == (SIZES["n_head"], len(ids), len(ids))
    np.testing.assert_allclose(probs, oracle_probs(folder, ids)[LAYER], atol=1e-5)
    np.testing.assert_allclose(probs.sum(-1), 1, atol=1e-5)
    assert not probs[..., np.triu(np.ones((len(ids), len(ids)), bool), k=1)].any()


def test_attention_graph_gives_generates_logits(folder):
    # The attention map's graph is generate's plus one output: the same logits,
    # so the same greedy text.
    prompt = "The cat sat on the mat because it was tired"
    amap, app = load_attention_model(folder, LAYER, "cpu"), load_gpt2(folder, device="cpu")
    ids = np.array([app.tokenizer.encode(prompt)])
    _, logits = amap.attention(ids)
    np.testing.assert_array_equal(logits, app.step(ids, app.empty_cache(1))[0])
    greedy = Sampling(temperature=0.0, top_k=None)
    assert generate(amap, [prompt], 6, greedy)[0].tokens == generate(app, [prompt], 6, greedy)[0].tokens


def test_one_head_png(folder, tmp_path, capsys):
    out = tmp_path / "head.png"
    assert main(["--model", str(folder), "--layer", "1", "--head", "2", "--out", str(out), "Hello world, again"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert png_size(out) == figure_pixels(1) == (640, 640)


def test_all_heads_grid_png(folder, tmp_path):
    out = tmp_path / "grid.png"
    assert main(["--model", str(folder), "--layer", "1", "--out", str(out), "Hello world, again"]) == 0
    assert png_size(out) == figure_pixels(SIZES["n_head"]) == (4 * 320, 320)


def test_a_heads_picture_changes_with_the_prompt(folder, tmp_path):
    model = load_attention_model(folder, LAYER, "cpu")
    first, second = (model.tokenizer.encode(p) for p in ("The cat sat on the mat", "A dog ran in the park"))
    assert len(first) == len(second)
    assert not np.allclose(probabilities(model, first)[1], probabilities(model, second)[1])
    pictures = []
    for i, prompt in enumerate(("The cat sat on the mat", "A dog ran in the park")):
        out = tmp_path / f"{i}.png"
        assert main(["--model", str(folder), "--layer", "1", "--head", "1", "--out", str(out), prompt]) == 0
        pictures.append(out.read_bytes())
    assert pictures[0] != pictures[1]


@pytest.mark.parametrize("args, message", [
    (["--layer", "2"], "--layer 2: this model has 2 layers (0-1)"),
    (["--layer", "-1"], "--layer -1: this model has 2 layers"),
    (["--head", "4"], "--head 4: this model has 4 heads per layer (0-3)"),
    (["--head", "first"], "give a head number or 'all'"),
])
def test_out_of_range(folder, args, message, capsys, tmp_path):
    assert main(["--model", str(folder), "--out", str(tmp_path / "x.png"), *args, "Hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and not (tmp_path / "x.png").exists()


def test_empty_prompt_and_missing_model(folder, capsys, tmp_path):
    assert main(["--model", str(folder), "  "]) == 2
    assert "the prompt is empty" in capsys.readouterr().err
    assert main(["--model", str(tmp_path / "nowhere"), "Hello"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_help():
    done = run_python("-m", "model.attention_map", "--help")
    assert done.returncode == 0 and "--layer" in done.stdout and "--head" in done.stdout


def test_impl_steps_draws_the_learners_attention(folder, tmp_path):
    """The payoff: a learner who finished the course draws their own attention.
    Their steps/ here: every solution, its imports pointed at steps/ (as a
    learner's own files import each other)."""
    import os
    import shutil
    import subprocess
    import sys

    from checker.skeleton import ROOT, SOLUTIONS

    steps = tmp_path / "learner" / "steps"
    steps.mkdir(parents=True)
    shutil.copy(ROOT / "steps" / "__init__.py", steps / "__init__.py")
    for solution in SOLUTIONS.glob("solution_*.py"):
        text = solution.read_text().replace("solutions.solution_", "steps.step_")
        (steps / solution.name.replace("solution_", "step_")).write_text(text)
    out = tmp_path / "mine.png"
    done = subprocess.run(
        [sys.executable, "-m", "model.attention_map", "--impl", "steps", "--model", str(folder), "--layer", "1",
         "--head", "0", "--out", str(out), "Hello world, again"],
        cwd=steps.parent, capture_output=True, text=True, timeout=900,
        env=dict(os.environ, PYTHONPATH=pythonpath(steps.parent, ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(out) and png_size(out) == (640, 640)
    assert "note:" not in done.stderr  # no step fell back to solutions/
    if caches.enabled():  # the solutions' graph, saved by the suite's unit or the test above, found by tracing
        assert "compiling" not in done.stderr


def test_impl_steps_names_an_unfinished_step(folder, tmp_path, capsys):
    # The repository's steps/ are the skeletons: every step the map needs is named, 15 included.
    assert main(["--impl", "steps", "--model", str(folder), "--layer", "1", "--out", str(tmp_path / "x.png"),
                 "Hello"]) == 2
    err = capsys.readouterr().err
    assert "steps/step_01.py (line " in err and "steps/step_11.py (line " in err and "steps/step_15.py (line " in err
