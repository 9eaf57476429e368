"""Device and dtype selection (the GPU path is chosen by this logic; no GPU
is needed to test it)."""

from __future__ import annotations

import pytest

from model.device import DeviceError, Placement, accelerator_count, choose


@pytest.mark.parametrize("device, dtype, accelerators, expected", [
    ("auto", "auto", 0, Placement("cpu", "float32")),
    ("auto", "auto", 1, Placement("gpu", "bfloat16")),
    ("cpu", "auto", 1, Placement("cpu", "float32")),
    ("gpu", "auto", 2, Placement("gpu", "bfloat16")),
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
    # What MAX reports here decides `auto`; these CI machines have no GPU.
    count = accelerator_count()
    assert choose("auto", "auto").kind == ("gpu" if count else "cpu")
