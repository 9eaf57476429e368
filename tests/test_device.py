"""Device and dtype selection (the GPU path is chosen by this logic; no GPU
is needed to test it)."""

from __future__ import annotations

import pytest

from model.device import DeviceError, Placement, accelerator_count, choose


@pytest.mark.parametrize("device, dtype, accelerators, expected", [
    ("auto", "auto", 0, Placement("cpu", "float32")),
    ("auto", "auto", 1, Placement("gpu", "float32")),
    ("cpu", "auto", 1, Placement("cpu", "float32")),
    ("gpu", "auto", 2, Placement("gpu", "float32")),
    ("gpu", "float32", 1, Placement("gpu", "float32")),
    ("auto", "float32", 1, Placement("gpu", "float32")),
    ("cpu", "q4_0", 1, Placement("cpu", "q4_0")),
    ("auto", "q4_0", 0, Placement("cpu", "q4_0")),
    ("auto", "q6_k", 0, Placement("cpu", "q6_k")),
])
def test_choice(device, dtype, accelerators, expected):
    assert choose(device, dtype, accelerators) == expected


def test_bfloat16_on_the_cpu_is_refused():
    for device, accelerators in (("cpu", 1), ("auto", 0)):
        with pytest.raises(DeviceError, match="bfloat16 runs on a GPU only"):
            choose(device, "bfloat16", accelerators)


@pytest.mark.parametrize("dtype", ["q4_0", "q6_k"])
def test_quantized_weights_on_a_gpu_are_refused(dtype):
    for device in ("gpu", "auto"):
        with pytest.raises(DeviceError, match=f"{dtype} runs on the CPU only"):
            choose(device, dtype, 1)


def test_gpu_without_accelerator_is_refused():
    with pytest.raises(DeviceError, match="no accelerator"):
        choose("gpu", "auto", 0)


@pytest.mark.parametrize("device, dtype", [("tpu", "auto"), ("cpu", "float16")])
def test_unknown_values(device, dtype):
    with pytest.raises(DeviceError, match="choose one of"):
        choose(device, dtype, 0)


def test_this_machine():
    # What MAX reports here decides `auto` (in the suite, none: tests/conftest.py hides the GPUs).
    count = accelerator_count()
    assert choose("auto", "auto").kind == ("gpu" if count else "cpu")


def test_a_build_sets_its_own_dtype_and_device_over_max_s_defaults():
    """On a machine with a GPU, MAX's defaults for new tensors are the
    accelerator and bfloat16; a CPU float32 build must not take them. Here the
    bfloat16 default is set by hand: every parameter is still float32. The
    device half needs a GPU in sight: `pixi run test-gpu` runs this file so,
    and there the build also runs under MAX's own defaults."""
    from max.driver import CPU
    from max.dtype import DType
    from max.experimental.tensor import default_device, default_dtype

    from model.course import course
    from model.graph import build_lm
    from model.options import BuildOptions
    from solutions.solution_01 import GPT2Config

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=4)
    with default_dtype(DType.bfloat16), default_device(CPU()):
        lm = build_lm(course("solutions"), config, BuildOptions(device="cpu", dtype="float32"))
    kinds = {(str(t.dtype), str(t.device)) for _, t in lm.parameters}
    assert kinds == {(str(DType.float32), str(CPU()))}
    if accelerator_count():  # MAX's defaults there: the GPU, in bfloat16
        lm = build_lm(course("solutions"), config, BuildOptions(device="cpu", dtype="float32"))
        assert {(str(t.dtype), str(t.device)) for _, t in lm.parameters} == {(str(DType.float32), str(CPU()))}


def test_weight_bytes_count_what_the_graph_holds():
    """bfloat16 builds cast float32 arrays to 2 bytes a value (the bench's
    weights-read figure); a tied array counts once; quantized blocks as they are."""
    import numpy as np

    from model.gpt2 import weight_bytes

    wte, blocks = np.zeros((10, 4), np.float32), np.zeros(7, np.uint8)
    weights = {"wte": wte, "lm_head": wte, "q": blocks}
    assert weight_bytes(weights, Placement("gpu", "bfloat16")) == 80 + 7
    assert weight_bytes(weights, Placement("cpu", "float32")) == 160 + 7


def test_bfloat16_weights_are_rounded_as_max_rounds():
    """A GPU build's weights are cast to bfloat16 in numpy (model/gpt2.py's
    as_bfloat16), bit for bit as MAX's own cast: ties to even, NaN kept."""
    import numpy as np
    from max.driver import CPU
    from max.dtype import DType
    from max.graph.buffer_utils import cast_dlpack_to

    from model.gpt2 import as_bfloat16

    rng = np.random.default_rng(0)
    a = (rng.standard_normal(4096) * 10.0 ** rng.integers(-30, 30, 4096)).astype(np.float32)
    a[:4] = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), np.inf]  # two ties (down to even, up to even), -tie, inf
    a = a.reshape(64, 64)
    ints = np.zeros(3, np.int64)
    out = as_bfloat16({"w": a, "tied": a, "ids": ints})
    assert out["w"] is out["tied"] and out["ids"] is ints
    mine = np.from_dlpack(out["w"].view(DType.uint16, [64, 64]))
    maxs = np.from_dlpack(cast_dlpack_to(a, DType.float32, DType.bfloat16, CPU()).view(DType.uint16, [64, 64]))
    assert (mine == maxs).all()
    nan = np.array([0x7FC00000, 0x7F800001], np.uint32).view(np.float32)  # a quiet NaN, a signalling one
    bits = np.from_dlpack(as_bfloat16({"n": nan})["n"].view(DType.uint16, [2]))
    assert ((bits & 0x7F80) == 0x7F80).all() and (bits & 0x7F).all()  # still NaN, not infinity


def test_auto_takes_the_cpu_on_macos_and_says_so(monkeypatch):
    """No Apple GPU has run the graph: auto passes it over there (an explicit
    --device gpu still asks MAX); elsewhere auto takes a GPU it sees."""
    from model import device

    monkeypatch.setattr(device.sys, "platform", "darwin")
    assert device.choose("auto", "auto", accelerators=1) == device.Placement("cpu", "float32")
    assert device.choose("gpu", "auto", accelerators=1) == device.Placement("gpu", "float32")
    assert "macOS" in device.auto_note("auto") and device.auto_note("cpu") is None
    monkeypatch.setattr(device.sys, "platform", "linux")
    assert device.choose("auto", "auto", accelerators=1).kind == "gpu" and device.auto_note("auto") is None


def test_bfloat16_on_a_gpu_is_refused_under_a_max_that_computes_it_wrong(monkeypatch):
    """A GPU runs float32 unless bfloat16 is asked for; under a MAX release
    known to give wrong bfloat16 matmuls (26.7: modular/modular#6883) it is
    refused in one line naming the fault and the release; under another
    release it runs, and tests/test_gpu.py's probes judge it."""
    from model import device

    assert choose("gpu", "auto", accelerators=1).dtype == "float32"
    why = device.bfloat16_fault("26.7.0")
    assert "modular/modular#6883" in why and "MAX 26.7.0" in why and "\n" not in why
    assert device.bfloat16_fault("26.7.3") is not None and device.bfloat16_fault("26.8.0") is None
    assert device.bfloat16_fault("27.1.0") is None
    if device.bfloat16_fault() is not None:  # the installed MAX (pyproject.toml pins 26.7)
        with pytest.raises(DeviceError, match="modular/modular#6883"):
            choose("gpu", "bfloat16", accelerators=1)
    monkeypatch.setattr(device, "bfloat16_fault", lambda max_version=None: None)  # a release without the fault
    assert choose("gpu", "bfloat16", accelerators=1) == Placement("gpu", "bfloat16")
    with pytest.raises(DeviceError, match="bfloat16 runs on a GPU only"):
        choose("cpu", "bfloat16", accelerators=1)


def test_the_suite_runs_with_the_gpus_hidden():
    """tests/conftest.py hides the GPUs from the suite's processes (the suite tests the CPU,
    as CI does, on a machine with a GPU too); `test-gpu` shows them to the GPU's tests."""
    import os

    from conftest import TEST_GPUS

    from model.device import GPU_VISIBILITY

    if os.environ.get(TEST_GPUS) == "1":
        pytest.skip("this run shows the GPUs (test-gpu)")
    assert all(os.environ.get(name) == "" for name in GPU_VISIBILITY)
    assert accelerator_count() == 0 and choose("auto", "auto").kind == "cpu"
