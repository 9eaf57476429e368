"""The serving architecture's parts that need no server: the in-graph ragged
positions, the weights in the engine's dtype, and the launcher's command line."""

from __future__ import annotations

import ast
import inspect
import json
import sys

import numpy as np
import pytest
from conftest import run_python

from serve.__main__ import StartError, build_parser, main, serve_command
from weights.resolve import DEMO


def test_ragged_positions():
    """Three sequences laid end to end (3, 1 and 2 new tokens) after 0, 5 and 2
    cached tokens: each token's position is its cache length plus its place."""
    from checker import maxrun
    from serve.network import ragged_positions

    offsets = np.array([0, 3, 4, 6], dtype=np.uint32)
    cached = np.array([0, 5, 2], dtype=np.uint32)
    got = maxrun.lazily(lambda o, c: ragged_positions(o, c, 6), maxrun.tensor(offsets), maxrun.tensor(cached),
                        what="ragged_positions")
    assert got.tolist() == [0, 1, 2, 5, 2, 3]


def test_echo_spans_find_each_sequence_s_own_rows():
    """Sequences of 3, 1 and 5 tokens end to end: with --echo the graph scores
    every token (serve/network.py; the served echo tests run it against HF's
    logits), without it each sequence's last, where an echo request's rows
    are missing."""
    from serve.model import echo_spans

    offsets = np.array([0, 3, 4, 9], dtype=np.uint32)
    spans = echo_spans(np.arange(9), offsets, [True, False, True])
    assert spans == [slice(0, 3), None, slice(4, 9)]
    with pytest.raises(ValueError, match="--echo"):
        echo_spans(offsets[1:] - 1, offsets, [True, False, False])


def test_weights_in_the_engines_dtype():
    from max.dtype import DType

    from serve.weight_adapters import gpt2_state
    from weights import load_state, read_config

    config = read_config(DEMO)
    state = gpt2_state(DEMO, config, DType.bfloat16, config.vocab_size)  # what a GPU serves
    assert {w.dtype for w in state.values()} == {DType.bfloat16}
    assert set(state) == set(load_state(DEMO, config))  # the app's names, the tied head included
    f32 = gpt2_state(DEMO, config, DType.float32, config.vocab_size)
    np.testing.assert_array_equal(np.from_dlpack(f32["lm_head.weight"].data),
                                  np.from_dlpack(f32["transformer.wte.weight"].data))


def test_a_wider_head_gets_zero_rows_past_the_vocabulary():
    """On a GPU the graph's head is 50304 rows (model/gpt2.py's graph_vocab):
    the served state widens the tied embedding and head as the app does."""
    from types import SimpleNamespace

    from max.dtype import DType

    from model.gpt2 import graph_vocab
    from serve.weight_adapters import gpt2_state
    from weights import read_config

    config = read_config(DEMO)
    width = graph_vocab(config.vocab_size, SimpleNamespace(kind="gpu"))  # a placement on a GPU
    assert width == 50304
    state = gpt2_state(DEMO, config, DType.float32, width)
    head, wte = (np.from_dlpack(state[n].data) for n in ("lm_head.weight", "transformer.wte.weight"))
    assert head.shape == wte.shape == (width, config.n_embd)
    np.testing.assert_array_equal(head, wte)
    assert not head[config.vocab_size:].any() and head[: config.vocab_size].any()


def test_a_float32_checkpoint_reaches_the_engine():
    """float32 files are memory-mapped read-only; the engine's DLPack import
    refuses read-only arrays, so the adapter hands it writable ones."""
    from checkpoints import reference
    from max.dtype import DType
    from max.experimental.tensor import Tensor

    from serve.weight_adapters import gpt2_state
    from weights import read_config

    folder, _, _ = reference("tiny-2l-4h")  # saved by HF in float32
    state = gpt2_state(folder, read_config(folder), DType.float32, read_config(folder).vocab_size)
    for data in state.values():
        Tensor.from_dlpack(data)  # what the engine's compile does with every weight


def command(*argv: str) -> list[str]:
    args = build_parser().parse_args(list(argv))
    args.passthrough = []
    return serve_command(args)[0]


def test_the_command_line_declares_what_gpt2_needs(monkeypatch):
    from model import device

    cmd = command("--model", "demo", "--device", "cpu")
    flags = {cmd[i]: cmd[i + 1] for i in range(3, len(cmd) - 1) if cmd[i].startswith("--")}
    assert cmd[:3] == [sys.executable, "-m", "serve.engine"]  # max serve, with the checks in front
    assert flags["--custom-architectures"].endswith(":serve")
    assert flags["--served-model-name"] == "demo"
    assert flags["--quantization-encoding"] == "float32"
    assert flags["--max-length"] == str(json.loads((DEMO / "config.json").read_text())["n_positions"])
    assert flags["--weight-path"] == str(DEMO / "model.safetensors")
    monkeypatch.setattr(device, "accelerator_count", lambda: 1)  # --device gpu is refused where MAX sees none
    on_gpu = dict(zip(*[iter(command("--model", "demo", "--device", "gpu")[3:])] * 2))
    assert (on_gpu["--devices"], on_gpu["--quantization-encoding"]) == ("gpu", "float32")  # float32 on a GPU too


def imported_by(code: str, package: str) -> list[str]:
    """The first few modules of ``package`` that running ``code`` in a new Python imports."""
    listing = f"print([m for m in sorted(sys.modules) if m == {package!r} or m.startswith({package + '.'!r})][:3])"
    done = run_python("-c", f"import sys\n{code}\n{listing}", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_the_launcher_imports_no_max_and_the_engine_finds_the_architecture():
    # MAX's pipelines take seconds to import: the launcher (python -m serve) starts the engine without them.
    assert imported_by("from serve.__main__ import main; from serve.shipped import start_note; start_note('cpu')",
                       "max") == []
    import serve

    [arch] = serve.ARCHITECTURES  # what --custom-architectures reads, made when asked
    assert arch.name == "GPT2LMHeadModel"


def test_the_engine_s_workers_do_not_import_max_s_pipelines_through_it():
    # MAX starts its metrics and model workers with multiprocessing's spawn, which imports the
    # engine's module (serve/engine.py) again in each: with MAX's pipelines imported there the
    # metrics worker took 4-6 s to start instead of ~1.
    assert imported_by("import serve.engine", "max.pipelines") == []


def test_the_checks_seam_is_where_max_s_entry_builds_its_app():
    """serve/engine.py hands MAX's entry its app wrapped in serve/checks.py's
    CompletionChecks by rebinding the one name the entry calls. An engine
    upgrade that moves it must fail here, not serve unchecked."""
    from max.serve import api_server

    from model.max_internals import serve_entrypoints
    from serve.checks import CompletionChecks
    from serve.engine import with_checks

    pipelines, entry = serve_entrypoints()
    assert entry.fastapi_app is api_server.fastapi_app
    assert "fastapi_app(" in inspect.getsource(entry.serve_api_server_and_model_worker)
    assert "serve" in pipelines.main.commands

    class Serving:
        class pipeline_config:
            class model:
                model_name = "demo"  # --served-model-name, else the model's path

                class huggingface_config:
                    vocab_size = 50257

    class Settings:
        max_request_bytes = 1000

    app = with_checks(lambda settings, serving: "MAX's app")(Settings, Serving)
    assert isinstance(app, CompletionChecks)
    assert (app.app, app.served, app.vocab, app.echo, app.max_bytes) == ("MAX's app", "demo", 50257, False, 1000)


def test_usage_errors_before_any_server(tmp_path, capsys):
    with pytest.raises(StartError, match="--max-length must be 1..256"):
        command("--model", "demo", "--max-length", "4096")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert main(["--model", str(tmp_path)]) == 2
    assert "only GPT-2-architecture models are supported" in capsys.readouterr().err


def test_the_linear_choice_reaches_the_engine(monkeypatch):
    """`--linear` travels to the engine's process in the environment, in the
    build options; the few-rows kernel is used for float32 on the CPU only."""
    from model.layers import linear_maker
    from model.layers.few_rows import FewRowsLinear
    from model.options import BuildOptions
    from serve.model_config import OPTIONS, served_options

    def env(*argv):
        args = build_parser().parse_args(["--model", "demo", "--device", "cpu", *argv])
        args.passthrough = []
        return serve_command(args)[1]

    for argv, linear in (((), "custom"), (("--linear", "course"), "course")):
        monkeypatch.setenv(OPTIONS, env(*argv)[OPTIONS])
        assert served_options() == BuildOptions(device="cpu", dtype="float32", linear=linear)
    custom = BuildOptions(device="cpu", dtype="float32")
    assert linear_maker(custom) is FewRowsLinear
    assert linear_maker(BuildOptions(device="cpu", dtype="float32", linear="course")) is None  # nn.Linear
    monkeypatch.setattr("model.device.accelerator_count", lambda: 1)  # as on a GPU machine
    assert linear_maker(BuildOptions(device="gpu", dtype="float32")) is None
    monkeypatch.setenv(OPTIONS, '{"linear": "fast"}')
    with pytest.raises(ValueError, match="linear must be one of"):
        served_options()


@pytest.fixture
def learner(tmp_path, monkeypatch):
    """Make `import steps` find a learner's folder (as if it were the current
    directory): ``learner(finished)`` writes it and returns it. The modules it
    imports are dropped afterwards, and the repository's come back."""
    import sys

    from checkpoints import learner_tree

    def use(finished: bool):
        folder, _ = learner_tree(tmp_path, finished)
        for name in [n for n in sys.modules if n == "steps" or n.startswith("steps.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.syspath_prepend(str(folder))
        return folder

    yield use
    for name in [n for n in sys.modules if n == "steps" or n.startswith("steps.")]:
        del sys.modules[name]


def test_impl_steps_refuses_unfinished_steps_before_any_server(learner, monkeypatch, capsys):
    """As `python -m model --impl steps`: every unfinished step the model
    needs, named in one line, exit 2, and no `max serve` started."""
    import serve.__main__ as launcher
    from tasks import task_command

    learner(finished=False)

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(launcher.subprocess, "Popen", no_server)
    assert main(["--model", "demo", "--device", "cpu", "--impl", "steps"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("serve: --impl steps builds GPT-2 from your steps") and err.count("\n") == 1, err
    for step in [f"{n:02d}" for n in range(1, 12)]:
        assert f"steps/step_{step}.py (line " in err and f"`{task_command('s' + step)}`" in err


def test_the_impl_and_the_learner_s_folder_reach_the_engine(learner, monkeypatch):
    """`--impl` travels in the environment, and with `steps` the folder this
    process imports `steps` from goes first on the engine's PYTHONPATH:
    the repository (which has its own steps/ skeletons) comes after it."""
    import os

    from checker.skeleton import ROOT
    from serve.model_config import OPTIONS, served_options

    def env(*argv):
        args = build_parser().parse_args(["--model", "demo", "--device", "cpu", *argv])
        args.passthrough = []
        return serve_command(args)[1]

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    plain = env()
    assert plain["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    folder = learner(finished=True)
    steps = env("--impl", "steps")
    assert steps["PYTHONPATH"].split(os.pathsep) == [str(folder), str(ROOT), "/elsewhere"]

    for launched, choice in ((plain, "solutions"), (steps, "steps")):
        monkeypatch.setenv(OPTIONS, launched[OPTIONS])
        assert served_options().impl == choice
    monkeypatch.setenv(OPTIONS, '{"impl": "mine"}')
    with pytest.raises(ValueError, match="impl must be one of"):
        served_options()


@pytest.mark.parametrize("impl", ["solutions", "steps"])
def test_the_served_network_is_the_course_s_with_the_app_s_names(impl, learner):
    """Built under F.lazy() (nothing compiles): step 11's model from the
    chosen code, step 07's attention itself (the paged cache is an object its
    forward calls), and
    exactly the parameter names weights/ loads for the app."""
    from max.dtype import DType
    from max.experimental import functional as F
    from max.experimental.tensor import default_dtype

    from model.course import config_class, course
    from serve.network import GPT2Ragged
    from weights import load_state, read_config

    if impl == "steps":
        folder = learner(finished=True)
    config = read_config(DEMO, config_class(impl))
    with F.lazy(), default_dtype(DType.float32):
        network = GPT2Ragged(config, kv_params=None, impl=impl)
    kit = course(impl)
    assert set(dict(network.parameters)) == set(load_state(DEMO, config))
    block = network.transformer.h[0]
    # Step 07's class itself, not a subclass (named, not compared by identity: a test before this one
    # may have imported the course's modules afresh, leaving two copies of the class in the process).
    attention = type(block.attn)
    assert (attention.__module__, attention.__qualname__) == (kit.GPT2MultiHeadAttention.__module__,
                                                              "GPT2MultiHeadAttention")
    assert type(block).__module__ == ("solutions.solution_09" if impl == "solutions" else "steps.step_09")
    if impl == "steps":
        import sys

        assert sys.modules["steps.step_09"].__file__ == str(folder / "steps" / "step_09.py")


def test_the_architecture_declares_penalties_and_in_flight_batching():
    """serve/arch.py's required_arguments name real config fields: the
    engine skips a name no config has without a word, so a renamed field
    would quietly turn penalties or in-flight batching off (or, with --echo,
    leave the prefix cache on). The command line does not carry them."""
    from max.pipelines.kv_cache.config import KVCacheConfig
    from max.pipelines.lib import PipelineConfig
    from max.pipelines.lib.config.model_config import MAXModelConfig
    from max.pipelines.lib.pipeline_runtime_config import PipelineRuntimeConfig
    from max.pipelines.sampling.sampling_config import SamplingConfig

    from serve.arch import gpt2_arch, required_arguments

    assert gpt2_arch.required_arguments == {"enable_penalties": True, "enable_in_flight_batching": True}
    echo = required_arguments(echo=True)
    assert echo == {"enable_penalties": True, "enable_in_flight_batching": True,
                    "enable_prefix_caching": False, "enable_chunked_prefill": False}
    assert "enable_penalties" in SamplingConfig.model_fields
    assert {"enable_in_flight_batching", "enable_chunked_prefill"} <= set(PipelineRuntimeConfig.model_fields)
    assert "enable_prefix_caching" in KVCacheConfig.model_fields
    for name in echo:  # each has one receiver (none is also a model or top-level field)
        assert name not in PipelineConfig.model_fields and name not in MAXModelConfig.model_fields
    flags = command("--model", "demo", "--device", "cpu", "--echo")
    assert "--enable-in-flight-batching" not in flags and "--enable-echo" not in flags


# MAX's telemetry imports it.
@pytest.mark.filterwarnings("ignore:pythonjsonlogger.jsonlogger has been moved:DeprecationWarning")
def test_metrics_on_and_nothing_sent_outside(monkeypatch):
    """The engine's environment: OTEL_SDK_DISABLED (MAX's egress switch that
    keeps the local /metrics), not MAX_SERVE_DISABLE_TELEMETRY (which would
    turn /metrics off too); --metrics-port reaches MAX's setting."""
    monkeypatch.delenv("MAX_SERVE_DISABLE_TELEMETRY", raising=False)
    monkeypatch.delenv("MAX_SERVE_METRICS_ENDPOINT_PORT", raising=False)

    def env(*argv):
        args = build_parser().parse_args(["--model", "demo", "--device", "cpu", *argv])
        args.passthrough = []
        return serve_command(args)[1]

    plain = env()
    assert plain["OTEL_SDK_DISABLED"] == "true"
    assert "MAX_SERVE_DISABLE_TELEMETRY" not in plain
    assert "MAX_SERVE_METRICS_ENDPOINT_PORT" not in plain
    assert env("--metrics-port", "9101")["MAX_SERVE_METRICS_ENDPOINT_PORT"] == "9101"
    # As MAX reads that environment: egress off (its exporters and start-up
    # log check MAX's telemetry test), /metrics on (it checks the raw setting).
    from max.serve.config import Settings

    from model.max_internals import telemetry_disabled

    for name in ("OTEL_SDK_DISABLED", "MAX_SERVE_DISABLE_TELEMETRY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_SDK_DISABLED", plain["OTEL_SDK_DISABLED"])
    settings = Settings()
    assert telemetry_disabled(settings) and not settings.disable_telemetry


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """HF's log_softmax, in float64: the reference for serve/model.py's scores."""
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_log_probabilities_are_hugging_face_s_log_softmax():
    """serve/model.py's logprobs on HF's own logits for the demo: the
    log-softmax to 1e-6 (MAX's kernel is off by up to 1.5e-3 here), the top
    n in order, a sampled token outside them added, none where n is 0."""
    from checkpoints import demo_reference

    from serve.model import log_probabilities

    logits = demo_reference()["logits"][0]  # [8, vocab] float32
    want = log_softmax(logits)
    unlikely = want.argmin(-1)
    got = log_probabilities(logits, unlikely, [5, 0, 3, 1, 7, 5, 5, 5])
    assert got[1] is None
    for row, (lp, n) in enumerate(zip(got, [5, 0, 3, 1, 7, 5, 5, 5])):
        if lp is None:
            continue
        top = list(np.argsort(-want[row])[:n])
        assert lp.sampled_token_ids == [int(unlikely[row])]
        assert lp.token_log_probabilities[0] == pytest.approx(want[row, unlikely[row]], abs=1e-6)
        (ranked,) = lp.top_log_probabilities
        assert list(ranked) == [*map(int, top), int(unlikely[row])]
        np.testing.assert_allclose(list(ranked.values()), want[row, [*top, unlikely[row]]], atol=1e-6)


def test_echo_log_probabilities_score_each_prompt_token_given_the_ones_before():
    """With echo, a sequence's step of n tokens gives n entries, as MAX's
    mixin does: token j+1's log-probability under position j's logits (HF's
    own, log-softmaxed to 1e-6), then the sampled token's under the last;
    a sequence without echo in the same batch keeps its one entry."""
    from checkpoints import demo_reference

    from serve.model import log_probabilities

    ref = demo_reference()
    logits, ids = ref["logits"][0], ref["ids"][0]  # [8, vocab], [8]
    want = log_softmax(logits)
    sampled = np.array([int(want[-1].argmin()), 7])
    # The sampled token is scored under the logits handed in as sampled from
    # (the sampler's, penalties applied), here position 5's, not under the
    # prompt's last row.
    got = log_probabilities(np.stack([logits[5], logits[2]]), sampled, [2, 1],
                            echo_rows=[logits, None], echo_tokens=[ids, None])
    echoed, plain = got
    targets = [*map(int, ids[1:]), int(sampled[0])]
    assert echoed.sampled_token_ids == targets
    np.testing.assert_allclose(echoed.token_log_probabilities, want[[*range(7), 5], targets], atol=1e-6)
    for top, t, row in zip(echoed.top_log_probabilities, targets, want[[*range(7), 5]]):
        assert list(top)[:2] == list(np.argsort(-row)[:2]) and t in top  # the top 2, and the token itself
    assert plain.sampled_token_ids == [7]
    assert plain.token_log_probabilities[0] == pytest.approx(want[2, 7], abs=1e-6)


def test_end_group_does_not_wait_on_a_group_of_zombies():
    """A process of the server's group that has exited but is this process's
    unreaped child (the launcher as a container's PID 1 inherits the
    server's orphans) is a zombie: killpg still finds it. end_group reaps it
    and returns at once instead of waiting out its grace period."""
    import subprocess
    import time

    from serve.__main__ import end_group

    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    pid = child.pid
    while open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "Z":  # exited, not yet reaped
        time.sleep(0.05)
    start = time.monotonic()
    end_group(pid, grace=10)
    assert time.monotonic() - start < 2
    child.returncode = 0  # reaped by end_group; keep Popen's destructor from waiting again


def test_auto_takes_a_gpu_it_sees_except_on_macos(monkeypatch):
    from model import device

    devices = lambda: dict(zip(*[iter(command("--model", "demo", "--device", "auto")[3:])] * 2))[  # noqa: E731
        "--devices"]
    monkeypatch.setattr(device, "accelerator_count", lambda: 1)
    monkeypatch.setattr(device.sys, "platform", "linux")
    assert devices() == "gpu"
    monkeypatch.setattr(device.sys, "platform", "darwin")
    assert devices() == "cpu"


def test_step_times_split_each_step_into_the_graph_and_the_engine(tmp_path, monkeypatch):
    """serve/step_times.py: nothing is written without its variable; with it, a
    line a step; the summary groups decode steps and steps with a prompt by
    batch size, takes the engine's part as the time to the next step's start
    that the graph did not take, and leaves a wait for requests out."""
    from serve import step_times

    path = tmp_path / "steps.jsonl"
    monkeypatch.delenv(step_times.VARIABLE, raising=False)
    with step_times.timed_step(1, 1, lambda: None):
        pass
    assert not path.exists()
    monkeypatch.setenv(step_times.VARIABLE, str(path))
    synced = []
    with step_times.timed_step(2, 9, lambda: synced.append(True)):
        pass
    [line] = step_times.read(path)
    assert synced == [True] and (line["sequences"], line["tokens"]) == (2, 9) and line["graph_s"] >= 0

    def step(start, graph, sequences, tokens):
        return {"start": start, "graph_s": graph, "sequences": sequences, "tokens": tokens}

    steps = [step(0.0, 0.100, 1, 16), step(0.110, 0.020, 1, 1), step(0.136, 0.020, 1, 1),
             step(0.162, 0.020, 1, 1), step(5.0, 0.020, 1, 1)]  # then 4.8 s idle: a new request
    rows = {(r["kind"], r["sequences"]): r for r in step_times.summary(steps)}
    assert set(rows) == {("decode", 1), ("with a prompt", 1)}
    decode = rows["decode", 1]
    assert decode["steps"] == 4 and decode["graph_ms"] == pytest.approx(20)
    assert decode["step_ms"] == pytest.approx(26) and decode["engine_ms"] == pytest.approx(6)
    assert rows["with a prompt", 1]["engine_ms"] == pytest.approx(10)
    assert "decode" in step_times.table(list(rows.values()))
