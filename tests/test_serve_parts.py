"""The serving architecture's parts that need no server: the in-graph ragged
positions, the weights in the engine's dtype, and the launcher's command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serve.__main__ import build_parser, main, serve_command
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


def test_weights_in_the_engines_dtype():
    from max.dtype import DType

    from serve.weight_adapters import gpt2_state
    from weights import load_state, read_config

    config = read_config(DEMO)
    state = gpt2_state(DEMO, config, DType.bfloat16)  # what a GPU serves
    assert {w.dtype for w in state.values()} == {DType.bfloat16}
    assert set(state) == set(load_state(DEMO, config))  # the app's names, the tied head included
    f32 = gpt2_state(DEMO, config, DType.float32)
    np.testing.assert_array_equal(np.from_dlpack(f32["lm_head.weight"].data),
                                  np.from_dlpack(f32["transformer.wte.weight"].data))


def test_a_float32_checkpoint_reaches_the_engine():
    """float32 files are memory-mapped read-only; the engine's DLPack import
    refuses read-only arrays, so the adapter hands it writable ones."""
    from max.dtype import DType
    from max.experimental.tensor import Tensor

    from checkpoints import reference
    from serve.weight_adapters import gpt2_state
    from weights import read_config

    folder, _, _ = reference("tiny-2l-4h")  # saved by HF in float32
    state = gpt2_state(folder, read_config(folder), DType.float32)
    for data in state.values():
        Tensor.from_dlpack(data)  # what the engine's compile does with every weight


def command(*argv: str) -> list[str]:
    args = build_parser().parse_args(list(argv))
    args.passthrough = []
    return serve_command(args)[0]


def test_the_command_line_declares_what_gpt2_needs():
    cmd = command("--model", "demo", "--device", "cpu")
    flags = {cmd[i]: cmd[i + 1] for i in range(2, len(cmd) - 1) if cmd[i].startswith("--")}
    assert cmd[1] == "serve"
    assert flags["--custom-architectures"].endswith(":serve")
    assert flags["--served-model-name"] == "demo"
    assert flags["--quantization-encoding"] == "float32"
    assert flags["--max-length"] == str(json.loads((DEMO / "config.json").read_text())["n_positions"])
    assert flags["--weight-path"] == str(DEMO / "model.safetensors")
    assert dict(zip(*[iter(command("--model", "demo", "--device", "gpu")[2:])] * 2)).get("--quantization-encoding") \
        == "bfloat16"


def test_usage_errors_before_any_server(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--max-length must be 1..256"):
        command("--model", "demo", "--max-length", "4096")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert main(["--model", str(tmp_path)]) == 2
    assert "only GPT-2-architecture models are supported" in capsys.readouterr().err


def test_the_linear_choice_reaches_the_engine(monkeypatch):
    """`--linear` travels to the engine's process in the environment; the
    few-rows kernel is used for float32 on the CPU only."""
    from types import SimpleNamespace

    from max.dtype import DType
    from max.graph import DeviceRef

    from serve.model import LINEAR, uses_kernels

    def env(*argv):
        args = build_parser().parse_args(["--model", "demo", "--device", "cpu", *argv])
        args.passthrough = []
        return serve_command(args)[1]

    assert env()[LINEAR] == "custom" and env("--linear", "course")[LINEAR] == "course"
    cpu32 = SimpleNamespace(devices=[DeviceRef.CPU()], dtype=DType.float32)
    gpu16 = SimpleNamespace(devices=[DeviceRef.GPU()], dtype=DType.bfloat16)
    monkeypatch.setenv(LINEAR, "custom")
    assert uses_kernels(cpu32) and not uses_kernels(gpu16)
    monkeypatch.setenv(LINEAR, "course")
    assert not uses_kernels(cpu32)
    monkeypatch.setenv(LINEAR, "fast")
    with pytest.raises(ValueError, match="expected course or custom"):
        uses_kernels(cpu32)
