"""model/doctor.py: the lines a bug report asks for, on any machine."""

from __future__ import annotations

import importlib.metadata

from conftest import run_python

from model import doctor


def test_doctor_names_what_a_bug_report_needs():
    # run_python passes the environment explicitly: after an earlier test loaded MAX's runtime
    # (tests/test_cpu.py does), a child that inherits it no longer finds the venv's numpy.
    done = run_python("-m", "model.doctor", timeout=120)
    assert done.returncode == 0, done.stderr
    keys = [line.split("  ", 1)[0].strip() for line in done.stdout.splitlines()]
    assert keys == ["python", "system", "max", "transformers", "cpu", "kernel path", "gpus", "--device auto",
                    "project cache", "MAX cache", "platform"]
    assert importlib.metadata.version("max") in done.stdout and "q4_0-band-" in done.stdout


def test_an_unknown_platform_is_called_untested(monkeypatch):
    monkeypatch.setattr(doctor.platform, "system", lambda: "FreeBSD")
    assert dict(doctor.lines())["platform"].startswith("untested")


def test_sizes_read_as_people_write_them():
    assert [doctor.human(n) for n in (12, 1_500, 999_999, 2_000_000, 3_400_000_000)] == \
        ["12 B", "1.5 KB", "1.0 MB", "2.0 MB", "3.4 GB"]


def test_the_gpu_line_names_a_variable_that_hides_gpus(monkeypatch):
    # The suite hides the GPUs (tests/conftest.py): a report from a run so set says so.
    from model.device import GPU_VISIBILITY

    monkeypatch.setattr("model.device.accelerator_count", lambda: 0)
    for name in GPU_VISIBILITY:
        monkeypatch.delenv(name, raising=False)
    assert doctor.gpus() == "none that MAX sees"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert doctor.gpus() == "none that MAX sees (CUDA_VISIBLE_DEVICES='')"


def test_the_gpus_seen_are_named_with_how_far_each_is_proven():
    assert doctor.gpus([("cuda", "sm_90a")]).startswith("1: cuda sm_90a")
    assert doctor.gpu_support([]) is None and doctor.gpu_support("1: (could not open: x)") is None
    assert doctor.gpu_support([("cuda", "sm_90a"), ("cuda", "sm_90a")]).startswith("sm_90a run: float32")
    assert "; sm_80 compiled, not run" in doctor.gpu_support([("cuda", "sm_90a"), ("cuda", "sm_80")])
    assert doctor.gpu_support([("hip", "gfx942")]) == \
        "gfx942 untested: nothing has compiled or run for it (docs/platforms.md)"


def test_every_gpu_architecture_named_is_one_the_targets_check_compiles():
    from artifacts import targets

    compiled = {target.gpu for target in targets.TARGETS.values()}
    assert set(doctor.GPU_SUPPORT) <= compiled


def test_the_kernel_path_line_says_what_auto_compiles_per_shape(monkeypatch):
    from model import cpu, doctor

    monkeypatch.setattr(cpu, "is_x86", lambda: True)
    monkeypatch.setattr(cpu, "microarchitecture", lambda: "zen4")
    monkeypatch.setattr(cpu, "native_path", lambda: "avx512-vnni")
    monkeypatch.setattr(cpu, "one_row_tiles", lambda: {"q8_0": cpu.OneRow("avx512-vnni-256"),
                                                       "q4_0": cpu.OneRow("avx512-vnni", prefetch=False)})
    assert doctor.auto_paths() == ("auto is avx512-vnni on this zen4, and for one input row (batch-1 decode): "
                                   "q8_0 avx512-vnni-256, q4_0 avx512-vnni without prefetch")
    monkeypatch.setattr(cpu, "native_path", lambda: "avx2")
    monkeypatch.setattr(cpu, "one_row_tiles", lambda: {})
    assert doctor.auto_paths() == "auto is avx2 on this zen4"
