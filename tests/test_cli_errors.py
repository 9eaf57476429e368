"""``python -m model`` answers bad input in one line with exit status 2, and
stops without a traceback when its reader goes away or Ctrl-C comes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from checker.skeleton import ROOT
from model import graph_source as portable
from model.generate import NotANumberError, generate
from model.sampling import Sampling, next_token
from weights.resolve import DEMO


def cli(*args: str | bytes, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "model", *args], cwd=ROOT, capture_output=True,
                          env=dict(os.environ, **{portable.BACKGROUND: "0"}, **(env or {})), timeout=900)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    said = done.stderr.decode().strip()
    assert done.returncode == 2 and len(said.splitlines()) == 1 and said.startswith("error: "), said
    return said


@pytest.mark.parametrize("args, message", [
    (["--seed", "-1", "x"], "--seed must be >= 0, got -1"),
    (["--temperature", "inf", "x"], "--temperature must be finite"),
    ([b"caf\xe9"], "a prompt is not UTF-8 text (byte 0xe9 at character 3)"),
    (["--stop", b"\xff", "x"], "a --stop string is not UTF-8 text (byte 0xff"),
    (["--model", "", "x"], "the model name is empty"),
])
def test_bad_input_is_one_line(args, message):
    assert message in one_line_error(cli(*args))


@pytest.mark.parametrize("field, value, message", [
    ("n_embd", None, "n_embd is null; expected a whole number > 0"),
    ("n_head", 2.5, "n_head is 2.5; expected a whole number > 0"),
    ("layer_norm_epsilon", "1e-5", 'layer_norm_epsilon is "1e-5"; expected a number > 0'),
    ("n_ctx", True, "n_ctx is true; expected a whole number > 0"),
])
def test_a_config_field_of_the_wrong_type_is_named(tmp_path, field, value, message):
    shutil.copytree(DEMO, tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config.pop("n_positions" if field == "n_ctx" else "", None)
    (tmp_path / "model" / "config.json").write_text(json.dumps({**config, field: value}))
    assert message in one_line_error(cli("--model", str(tmp_path / "model"), "x"))


def test_a_temperature_near_zero_is_greedy_not_nan():
    logits = np.array([1.0, 3.0, 2.0, -50.0], np.float32)
    rng = np.random.default_rng(0)
    assert next_token(logits, Sampling(temperature=1e-308, top_k=None), rng) == 1
    assert next_token(logits, Sampling(temperature=5e-324, top_p=0.5), rng) == 1


def test_nan_scores_are_named_not_sampled():
    """NaN weights make NaN scores: generation stops, saying why (the CLI's one line, exit 2)."""
    from weights import open_checkpoint

    checkpoint = open_checkpoint("demo")
    vocab = checkpoint.config.vocab_size
    gpt2 = SimpleNamespace(tokenizer=checkpoint.tokenizer, config=checkpoint.config, eos_token_ids=(), source="here",
                           empty_cache=lambda batch, length: None,
                           step=lambda ids, cache: (np.full((len(ids), vocab), np.nan, np.float32), cache))
    with pytest.raises(NotANumberError, match="the weights in here hold NaN or infinite values"):
        generate(gpt2, ["Hello"], 5, Sampling(), seed=0)


def test_nan_weights_are_one_line(tmp_path):
    folder = shutil.copytree(DEMO, tmp_path / "nan")
    state = load_file(folder / "model.safetensors")
    name = next(n for n in state if n.endswith("ln_f.weight"))
    state[name] = np.full_like(state[name], np.nan)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    done = cli("--model", str(folder), "--max-new-tokens", "3", "--quiet", "Hello")
    said = done.stderr.decode()  # (the graph's compile, when it is not saved, has its own lines)
    assert done.returncode == 2 and said.splitlines()[-1].startswith("error: the model's scores are NaN"), said
    assert "Traceback" not in said


def test_a_reader_that_goes_away_ends_the_run_quietly():
    """``python -m model ... | head -c 5``: no BrokenPipeError, the status a program SIGPIPE ends gives (greedy:
    the demo runs on to its context, never done before the reader goes)."""
    args = ["--model", "demo", "--temperature", "0", "--max-new-tokens", "300", "Hello"]
    child = subprocess.Popen([sys.executable, "-m", "model", *args], cwd=ROOT,
                             env=dict(os.environ, **{portable.BACKGROUND: "0"}), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    assert child.stdout.read(5) == b"Hello"
    child.stdout.close()
    assert child.wait(timeout=900) == 141
    said = child.stderr.read().decode()
    assert "Traceback" not in said and "BrokenPipe" not in said


def test_ctrl_c_during_the_compile_ends_the_run_at_once(tmp_path):
    """Inside MAX's compile (native code) Python's own handler would wait for the compile's end."""
    env = dict(os.environ, GPT2_MAX_CACHE=str(tmp_path), **{portable.USE: "0", portable.BACKGROUND: "0"})
    child = subprocess.Popen([sys.executable, "-m", "model", "--model", "demo", "Hello"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = ""
    while "compiling the model graph" not in said:
        said += child.stderr.readline()
    time.sleep(3)  # (into the trace or the compile: either way no traceback)
    child.send_signal(signal.SIGINT)
    sent = time.monotonic()
    said += child.stderr.read()
    assert child.wait(timeout=60) == 130 and time.monotonic() - sent < 10, said
    assert "Traceback" not in said and said.rstrip().endswith("interrupted")


def test_usage_errors_stay_usage_errors_in_process(capsys):
    from model.cli import main

    assert main(["--seed", "-2", "x"]) == 2
    assert capsys.readouterr().err == "error: --seed must be >= 0, got -2\n"

