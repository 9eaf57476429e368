"""The app end to end on a small random GPT-2 with the real GPT-2 tokenizer:
the compiled KV-cache path, batches, and the command line (`python -m model`)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from checkpoints import STEP_07_EDITS, edited_learner_tree, learner_tree, traced_digest_in, write_checkpoint
from checkpoints import TINY as SIZES
from conftest import run_python

from checker import oracle
from model import caches
from model.generate import generate
from model.gpt2 import load_gpt2
from model.sampling import Sampling
from weights import load_state, read_config

GREEDY = Sampling(temperature=0.0, top_k=None)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("app") / "tiny-gpt2", SIZES, tokenizer=True, seed=5)


@pytest.fixture(scope="module")
def gpt2(folder):
    return load_gpt2(folder, device="cpu")  # the app's graph: last position only


def test_cached_greedy_equals_uncached_oracle(gpt2, folder):
    weights = load_state(folder, read_config(folder))
    prompt = "Hello, I'm a language model,"
    [r] = generate(gpt2, [prompt], 12, GREEDY)
    ids = gpt2.tokenizer.encode(prompt)
    assert r.tokens == oracle.greedy(ids, weights, SIZES["n_head"], 12)


def test_batch_results_equal_each_prompt_alone(gpt2):
    prompts = ["The cat sat", "On a mat", "Hello world, how are", "A B"]
    together = generate(gpt2, prompts, 8, GREEDY)
    for prompt, r in zip(prompts, together):
        assert r.tokens == generate(gpt2, [prompt], 8, GREEDY)[0].tokens


def test_same_graph_serves_every_length(gpt2):
    compiled = gpt2.compiled
    for n in (1, 5, 40):
        gpt2.forward_logits(np.zeros((2, n), dtype=np.int64))
    assert gpt2.compiled is compiled  # nothing recompiled per length


def test_context_limit(gpt2):
    prompt = " x" * 60  # 60 tokens in a 64-token window
    [r] = generate(gpt2, [prompt], 20, GREEDY)
    assert len(r.prompt_tokens) == 60 and len(r.tokens) == 5 and r.stop_reason == "context"


def _cli(*args):
    return run_python("-m", "model", *args)


def test_cli_streams_and_summarises(folder):
    done = _cli("--model", str(folder), "--max-new-tokens", "6", "--seed", "1", "Hello")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Hello")
    assert "compile" in done.stderr and "tok/s" in done.stderr and "6 new tokens" in done.stderr


def test_cli_json_batch_greedy_is_deterministic(folder, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The cat sat\n\nOn a mat\n")
    args = ("--model", str(folder), "--prompt-file", str(prompts), "--json", "--temperature", "0",
            "--max-new-tokens", "5")
    first, second = _cli(*args), _cli(*args)
    assert first.returncode == 0, first.stderr
    rows = [json.loads(line) for line in first.stdout.splitlines()]
    assert [r["prompt"] for r in rows] == ["The cat sat", "On a mat"]
    assert all(r["new_tokens"] <= 5 and "decode_tokens_per_s" in r for r in rows)
    again = [json.loads(line) for line in second.stdout.splitlines()]
    assert [(r["text"], r["tokens"]) for r in rows] == [(r["text"], r["tokens"]) for r in again]


def test_cli_quiet_prints_only_text(folder):
    done = _cli("--model", str(folder), "--quiet", "--temperature", "0", "--max-new-tokens", "4", "Hi")
    assert done.returncode == 0 and done.stderr == "" and not done.stdout.startswith("Hi")


@pytest.mark.parametrize("args, message", [
    (["   "], "prompt is empty"),
    ([], "no prompt"),
    (["--temperature", "-1", "x"], "--temperature must be >= 0"),
    (["--top-k", "0", "x"], "--top-k must be >= 1"),
    (["--top-p", "0", "x"], "--top-p must be in (0, 1]"),
    (["--top-p", "1.1", "x"], "--top-p must be in (0, 1]"),
    (["--max-new-tokens", "0", "x"], "--max-new-tokens must be >= 1"),
    (["--prompt-file", "/nonexistent/prompts.txt"], "--prompt-file /nonexistent/prompts.txt: cannot read it"),
    (["--stop", "", "x"], "--stop strings must not be empty"),
])
def test_cli_bad_input(args, message):
    done = _cli(*args)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {message}" or (done.stderr.startswith("error: ") and message in done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1


def test_cli_bad_models(tmp_path, folder):
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["--model", str(empty), "x"], "no config.json"),
        (["--model", str(tmp_path / "missing"), "x"], "no such folder"),
        (["--model", str(folder), "--device", "gpu", "x"], "no accelerator"),
        (["--model", str(folder), "--device", "cpu", "--dtype", "bfloat16", "x"], "bfloat16 runs on a GPU only"),
    ]
    bad = write_checkpoint(tmp_path / "llama", dict(SIZES, vocab_size=64))
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(config, model_type="llama")))
    cases.append((["--model", str(bad), "x"], "only GPT-2-architecture"))
    truncated = write_checkpoint(tmp_path / "trunc", SIZES, tokenizer=True)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:-64])
    cases.append((["--model", str(truncated), "x"], "truncated"))
    for args, message in cases:
        done = _cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_cli_help_explains_every_flag():
    done = _cli("--help")
    for flag in ("--model", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--repetition-penalty",
                 "--stop", "--seed", "--device", "--dtype", "--impl", "--quiet", "--json", "--prompt-file"):
        assert flag in done.stdout


def _cli_in(cwd, env, *args):
    return subprocess.run([sys.executable, "-m", "model", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_impl_steps_names_every_unfinished_step_it_needs_at_once(tmp_path, folder):
    # It once named step 01 alone when 01-11 were all unfinished.
    from tasks import task_command

    cwd, env = learner_tree(tmp_path, finished=False)
    done = _cli_in(cwd, env, "--impl", "steps", "--model", str(folder), "x")
    assert done.returncode == 2
    needed = [f"{n:02d}" for n in range(1, 12)]
    for step in needed:
        assert f"steps/step_{step}.py (line " in done.stderr and f"`{task_command('s' + step)}`" in done.stderr
    assert "step_12" not in done.stderr and "step_15" not in done.stderr  # not needed to generate
    assert done.stderr.index("step_03.py") < done.stderr.index("step_10.py")  # in order
    # Before the model is looked up: offline, without --model, it named the hub instead.
    offline = _cli_in(cwd, dict(env, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf")), "--impl", "steps", "x")
    assert offline.returncode == 2 and "steps/step_01.py (line " in offline.stderr, offline.stderr


def test_the_steps_a_build_needs_follow_the_learner_s_imports(tmp_path):
    from model.course import MODEL_STEPS, steps_needed, unfinished_steps

    assert steps_needed(*MODEL_STEPS) == [f"{n:02d}" for n in range(1, 12)]
    assert steps_needed("07") == ["01", "02", "07"]
    folder = tmp_path / "steps"
    folder.mkdir()
    (folder / "step_01.py").write_text("x = 1\n")
    (folder / "step_02.py").write_text(
        'from steps.step_01 import x\n\n\n    raise NotImplementedError("TODO(step 02): ...")\n')
    assert unfinished_steps("02", folder=folder) == [("02", 4)]
    (folder / "step_02.py").write_text("from steps.step_01 import x\n")
    assert unfinished_steps("02", folder=folder) == []


def test_the_unfinished_message_counts_in_words():
    from model.course import unfinished_message

    one = unfinished_message([("15", 63)], ("15",))
    assert "one still has a TODO: steps/step_15.py (line 63)" in one and "Finish it" in one
    two = unfinished_message([("02", 4), ("07", 9)], ("07",))
    assert "2 still have TODOs: steps/step_02.py (line 4), steps/step_07.py (line 9)" in two


def test_impl_steps_runs_a_finished_course(tmp_path, folder):
    cwd, env = learner_tree(tmp_path, finished=True)
    args = ("--model", str(folder), "--temperature", "0", "--max-new-tokens", "6", "--quiet", "Hello")
    solutions = _cli(*args)  # its graph saved, if no test before saved it
    mine = _cli_in(cwd, env, "--impl", "steps", *args)
    assert mine.returncode == 0, mine.stderr
    assert mine.stdout == solutions.stdout
    if caches.enabled():  # the solutions' saved graph, found by tracing both (or, again, by the steps' name)
        assert "compiling" not in mine.stderr


def test_the_learner_s_step_07_is_the_attention_the_app_runs(tmp_path, folder, suite_graphs_of_this_test):
    # One edit compiled and run (minutes cold: the suite compiles it with others, tests/suite_graphs.py);
    # the tests below trace every edit (seconds).
    cwd, env = edited_learner_tree(tmp_path, STEP_07_EDITS["forward-without-c_proj"])
    args = ("--model", str(folder), "--temperature", "0", "--max-new-tokens", "8", "--quiet", "Hello")
    mine = _cli_in(cwd, env, "--impl", "steps", *args)
    assert mine.returncode == 0, mine.stderr
    assert mine.stdout != _cli(*args).stdout


def test_an_edited_step_07_is_not_given_the_solutions_graph(tmp_path, folder, gpt2):
    """``load_gpt2``'s lookup for a learner's build whose own graph is not
    saved yet (the solutions' graph saved: the ``gpt2`` fixture's) gives
    nothing for an edited step 07: the app compiles the learner's graph."""
    if not caches.enabled():
        pytest.skip("no saved graphs: nothing to be given")
    cwd, env = edited_learner_tree(tmp_path, STEP_07_EDITS["_attn-scaled"])
    code = ("from dataclasses import replace\n"
            "from model import saved_graphs\n"
            "from model.gpt2 import opened, traced_graph\nfrom model.graph_source import solutions_graph\n"
            "from model.options import BuildOptions\n"
            "options = BuildOptions(impl='steps', device='cpu')\n"
            f"checkpoint, config, _ = opened({str(folder)!r}, options)\n"
            "solutions = replace(options, impl='solutions')\n"
            f"print(saved_graphs.is_saved(saved_graphs.graph_name(solutions, opened({str(folder)!r}, solutions)[2])))\n"
            "print(solutions_graph(checkpoint, config, options, 'not-linked', opened, traced_graph))")
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "None"] and "solutions' graph exactly" not in done.stderr


def test_each_step_07_edit_changes_the_graph_the_app_builds(tmp_path, folder):
    """The graph the app compiles with --impl steps, traced: the finished steps
    trace the solutions' graph, and each edit of step 07 another one."""
    from checker.skeleton import ROOT

    solutions = traced_digest_in(ROOT, None, folder, "solutions")
    cwd, env = learner_tree(tmp_path / "finished", finished=True)
    assert traced_digest_in(cwd, env, folder, "steps") == solutions
    for edit, change in STEP_07_EDITS.items():
        cwd, env = edited_learner_tree(tmp_path / edit, change)
        assert traced_digest_in(cwd, env, folder, "steps") != solutions, edit


def test_ctrl_c_prints_what_was_generated_and_exits_130(folder, monkeypatch, capsys):
    import model.generate as engine
    from model import cli

    real = engine.generate

    def interrupted(gpt2, prompts, max_new_tokens, sampling, seed=None, on_text=None):
        calls = []

        def on_text_then_ctrl_c(i, text):
            calls.append(text)
            if on_text:
                on_text(i, text)
            if len(calls) == 3:
                raise KeyboardInterrupt

        return real(gpt2, prompts, max_new_tokens, sampling, seed, on_text_then_ctrl_c)

    monkeypatch.setattr(engine, "generate", interrupted)
    code = cli.main(["--model", str(folder), "--temperature", "0", "--max-new-tokens", "20", "Hello"])
    out = capsys.readouterr()
    assert code == 130
    assert out.out.startswith("Hello") and len(out.out.strip()) > len("Hello")
    assert "stop: interrupted" in out.err and "(interrupted)" in out.err


def test_usage_errors_arrive_before_the_model_is_loaded(folder, monkeypatch, capsys):
    import model.gpt2
    from model.cli import main

    monkeypatch.setattr(model.gpt2, "load_gpt2", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["--model", str(folder), " x" * 100]) == 2
    err = capsys.readouterr().err
    assert err == "error: the prompt has 100 tokens; GPT-2's context holds 64\n"
    assert main(["--model", str(folder / "nowhere"), "Hello"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    # `generate -- --model demo "Hello"`: after `--` the options are prompts.
    assert main(["--", "--model", "demo", "Hello"]) == 2
    assert capsys.readouterr().err.startswith("error: '--model' was read as a prompt (it came after `--`)")
