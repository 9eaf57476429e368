"""model/cpu.py: which kernel path a CPU runs, which it can, and the refusal
of one it cannot (before the AVX2 path, q4_0 wrote "!!!!" on an AVX2-only AMD EPYC)."""

from __future__ import annotations

import pytest

from model import cpu
from model.device import DeviceError, choose

# /proc/cpuinfo flags of the two machine kinds this project met (abridged).
XEON = frozenset("fma avx avx2 f16c avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16".split())
EPYC = frozenset("fma avx avx2 f16c bmi1 bmi2".split())  # AMD EPYC, cpu family 25 model 1: no AVX-512


@pytest.fixture
def x86(monkeypatch):
    monkeypatch.setattr(cpu, "is_x86", lambda: True)


def test_each_cpu_gets_its_own_path_and_q4_0_band(x86):
    assert cpu.native_path(XEON) == "avx512-vnni" and cpu.q4_0_band(XEON) == 32
    assert cpu.native_path(EPYC) == "avx2" and cpu.q4_0_band(EPYC) == 16
    assert cpu.native_path(frozenset({"sse4_2"})) == "portable"
    # AVX-512 without VNNI (Skylake-X) takes the AVX2 path; MAX's Q4_0 kernel still reads bands of 32 there.
    skylake = XEON - {"avx512_vnni"}
    assert cpu.native_path(skylake) == "avx2" and cpu.q4_0_band(skylake) == 32


def test_a_path_the_cpu_cannot_execute_is_refused_naming_the_feature(x86, monkeypatch):
    monkeypatch.setattr(cpu, "flags", lambda: EPYC)
    assert cpu.missing("avx512-vnni") == ["avx512f", "avx512bw", "avx512vl", "avx512_vnni"]
    assert cpu.missing("avx2") == [] and cpu.missing("portable") == []
    assert cpu.runnable_paths() == ["avx2", "portable"]
    assert cpu.kernel_path("avx2") == "avx2"
    monkeypatch.setenv(cpu.ENV, "avx512-vnni")
    with pytest.raises(cpu.KernelPathError) as refused:
        cpu.kernel_path()
    message = str(refused.value)
    assert "\n" not in message and "GPT2_MAX_KERNEL_PATH=avx512-vnni" in message and "avx512_vnni" in message
    # The app meets it where it chooses the device: before anything loads.
    with pytest.raises(DeviceError, match="lacks avx512f"):
        choose("cpu", "q4_0")


def test_an_unknown_path_is_refused(monkeypatch):
    monkeypatch.setenv(cpu.ENV, "avx9")
    with pytest.raises(DeviceError, match="choose one of auto, avx512-vnni, avx2, portable"):
        choose("cpu", "float32")


def test_the_path_numbers_are_the_kernels_own():
    # isa.mojo's AUTO, AVX512_VNNI, AVX2 and PORTABLE: the op parameter each path passes.
    import re

    from model.layers.custom_op import KERNELS

    source = (KERNELS / "isa.mojo").read_text()
    numbers = {name: int(n) for name, n in re.findall(r"^comptime (\w+) = (\d+)$", source, re.M)}
    assert numbers == {"AUTO": cpu.PATHS["auto"], "AVX512_VNNI": cpu.PATHS["avx512-vnni"],
                       "AVX2": cpu.PATHS["avx2"], "PORTABLE": cpu.PATHS["portable"],
                       "AVX512_VNNI_256": cpu.PATHS["avx512-vnni-256"]}


def test_a_saved_graph_is_named_for_the_cpu_it_was_compiled_on(monkeypatch):
    # A graph compiled for AVX-512 must not be found by an AVX2 machine that shares the cache folder.
    from model import saved_graphs
    from model.options import BuildOptions
    from solutions.solution_01 import GPT2Config

    config, options = GPT2Config(n_layer=2), BuildOptions(device="cpu", dtype="q4_0")
    monkeypatch.setattr(cpu, "describe", lambda: "x86_64 avx512-vnni q4_0-band-32")
    xeon = saved_graphs.graph_name(options, config)
    monkeypatch.setattr(cpu, "describe", lambda: "x86_64 avx2 q4_0-band-16")
    assert saved_graphs.graph_name(options, config) != xeon


def test_a_virtual_cpu_target_is_read_by_its_name():
    """archspec's features for the CPU a descriptor names, with the descriptor's own changes."""
    x86, features = cpu.target_features("x86-64-v3")
    assert x86 and {"sse4_2", "avx2", "fma", "f16c", "movbe"} <= features and "avx512f" not in features
    x86, features = cpu.target_features("triple=x86_64-unknown-linux-gnu;cpu=x86-64-v4;features=+avx512vnni")
    assert x86 and {"avx512f", "avx512_vnni", "avx2"} <= features
    x86, features = cpu.target_features("triple=aarch64-unknown-linux-gnu;cpu=neoverse-n1")
    assert not x86 and {"asimddp", "fphp"} <= features
    assert not cpu.target_features("triple=arm64-apple-darwin;cpu=apple-m1")[0]
    # A feature taken away, spaces and an empty part, as a hand-written descriptor may have them.
    x86, features = cpu.target_features(
        " triple=x86_64-unknown-linux-gnu; cpu=x86-64-v4 ;features=+avx512vnni,-avx512f;")
    assert x86 and "avx512_vnni" in features and "avx512f" not in features
    assert "avx2" in cpu.target_features("triple=x86_64-unknown-linux-gnu;cpu=skylake")[1]  # archspec knows it
    with pytest.raises(ValueError, match="archspec does not know"):
        cpu.target_features("triple=x86_64-unknown-linux-gnu;cpu=not-a-cpu")  # refused, not guessed


def test_an_x86_64_level_is_x86_on_any_host(monkeypatch):
    """On an Arm host (or a Mac), a bare level still names an x86-64 CPU."""
    monkeypatch.setattr(cpu.platform, "machine", lambda: "aarch64")
    assert cpu.target_features("x86-64-v3")[0] and not cpu.target_features("neoverse-n1")[0]


@pytest.mark.parametrize("target, path, band", [
    ("x86-64-v3", "avx2", 16),
    ("triple=x86_64-unknown-linux-gnu;cpu=x86-64-v4;features=+avx512vnni", "avx512-vnni", 32),
    ("triple=x86_64-unknown-linux-gnu;cpu=x86-64-v4", "avx2", 32),  # AVX-512 without VNNI, as Skylake-X
    ("triple=aarch64-unknown-linux-gnu;cpu=neoverse-n1", "portable", 8),
    ("triple=x86_64-unknown-linux-gnu;cpu=x86-64-v2", "portable", 8),  # SSE: 4 float lanes
])
def test_kernel_path_and_q4_0_band_follow_the_compile_target(monkeypatch, target, path, band):
    """A graph compiled for another CPU packs q4_0 in that CPU's band and
    names it in its saved graph's name, whatever this CPU is."""
    monkeypatch.setattr(cpu, "virtual_target", lambda: target)
    assert (cpu.native_path(), cpu.q4_0_band()) == (path, band)
    assert cpu.describe().endswith(f"{path} q4_0-band-{band} target {target}")


def test_each_op_takes_a_path_for_one_row_and_one_for_several():
    import re

    from model.layers.custom_op import KERNELS

    for name in ("matmul.mojo", "q4_0.mojo"):
        for signature in re.findall(r"def execute\[([^\]]*)\]", (KERNELS / name).read_text()):
            assert "isa: Int" in signature and "isa1: Int" in signature, (name, signature)


@pytest.fixture
def hypervisor(monkeypatch):
    """A CPU whose hypervisor hides features archspec names microarchitectures by:
    archspec answers the x86-64 level; /proc/cpuinfo still has the family and model."""
    import archspec.cpu

    monkeypatch.setattr(archspec.cpu, "host", lambda: archspec.cpu.TARGETS["x86_64_v4"])
    cpu.microarchitecture.cache_clear()
    yield lambda **fields: monkeypatch.setattr(cpu, "cpuinfo", lambda: fields)
    cpu.microarchitecture.cache_clear()


@pytest.mark.parametrize("vendor, family, model, name", [
    ("AuthenticAMD", "25", "17", "zen4"),     # EPYC 9004 (Genoa)
    ("AuthenticAMD", "25", "97", "zen4"),     # Ryzen 7000
    ("AuthenticAMD", "25", "1", "zen3"),      # EPYC 7003 (Milan)
    ("AuthenticAMD", "26", "2", "zen5"),
    ("AuthenticAMD", "23", "49", "zen2"),
    ("GenuineIntel", "6", "143", "x86_64_v4"),  # an Intel CPU stays archspec's answer
    ("AuthenticAMD", "99", "0", "x86_64_v4"),   # a family not listed too
])
def test_a_cpu_archspec_names_only_by_level_is_named_by_family_and_model(hypervisor, vendor, family, model, name):
    hypervisor(vendor_id=vendor, **{"cpu family": family, "model": model})
    assert cpu.microarchitecture() == name


def test_archspec_s_own_name_is_kept(monkeypatch):
    import archspec.cpu

    monkeypatch.setattr(archspec.cpu, "host", lambda: archspec.cpu.TARGETS["sapphirerapids"])
    cpu.microarchitecture.cache_clear()
    try:
        assert cpu.microarchitecture() == "sapphirerapids"
    finally:
        cpu.microarchitecture.cache_clear()


def test_auto_runs_the_one_row_path_measured_faster_on_its_microarchitecture(x86, monkeypatch):
    monkeypatch.delenv(cpu.ENV, raising=False)
    monkeypatch.setattr(cpu, "flags", lambda: XEON)
    monkeypatch.setattr(cpu, "virtual_target", lambda: "")
    monkeypatch.setattr(cpu, "microarchitecture", lambda: "zen4")
    monkeypatch.setattr(cpu, "ONE_ROW", {"zen4": {"q8_0": cpu.OneRow("avx512-vnni-256"),
                                                  "q4_0": cpu.OneRow("avx2", prefetch=False)}})
    assert cpu.op_paths(op="q8_0") == cpu.OpPaths(one_row="avx512-vnni-256", rows="auto")
    assert cpu.op_paths(op="q8_0").parameters("q8_0") == {"isa1": cpu.PATHS["avx512-vnni-256"],
                                                           "isa": cpu.PATHS["auto"]}
    assert cpu.op_paths(op="f32") == cpu.OpPaths(one_row="auto", rows="auto")  # no entry: its own path
    q4_0 = cpu.op_paths(op="q4_0")
    assert q4_0 == cpu.OpPaths(one_row="avx2", rows="auto", prefetch=False)
    assert q4_0.parameters("q4_0") == {"isa1": cpu.PATHS["avx2"], "isa": cpu.PATHS["auto"], "band": 32, "ahead": 0}
    # a saved graph's name follows the entries
    assert "one-row q8_0 avx512-vnni-256, q4_0 avx2 without prefetch (zen4)" in cpu.describe()
    # A forced path is forced for both shapes, with the defaults; GPT2_MAX_KERNEL_PATH too.
    assert cpu.op_paths("avx2", "q4_0") == cpu.OpPaths(one_row="avx2", rows="avx2")
    assert cpu.op_paths("avx2", "q4_0").parameters("q4_0")["ahead"] == cpu.Q4_0_AHEAD
    monkeypatch.setenv(cpu.ENV, "avx512-vnni")
    assert cpu.op_paths(op="q4_0") == cpu.OpPaths(one_row="avx512-vnni", rows="avx512-vnni")
    monkeypatch.delenv(cpu.ENV)
    # Another microarchitecture runs its own path for both.
    monkeypatch.setattr(cpu, "microarchitecture", lambda: "sapphirerapids")
    for op in cpu.OPS:
        assert cpu.op_paths(op=op) == cpu.OpPaths(one_row="auto", rows="auto")
    assert "one-row" not in cpu.describe()
    assert cpu.op_paths().resolved() == cpu.OpPaths(one_row="avx512-vnni", rows="avx512-vnni")


def test_a_graph_for_another_cpu_runs_that_cpu_s_own_paths(monkeypatch):
    """This CPU's microarchitecture says nothing of a virtual target's."""
    monkeypatch.delenv(cpu.ENV, raising=False)
    monkeypatch.setattr(cpu, "microarchitecture", lambda: "zen4")
    monkeypatch.setattr(cpu, "virtual_target", lambda: "x86-64-v3")
    assert cpu.op_paths(op="q4_0") == cpu.OpPaths(one_row="auto", rows="auto")


def test_every_one_row_entry_is_a_path_for_one_of_the_ops():
    for name, tiles in cpu.ONE_ROW.items():
        for op, tile in tiles.items():
            assert op in cpu.OPS and tile.path in cpu.NEEDS, (name, op)


def test_a_graph_shipped_for_other_cpus_is_traced_and_served_with_their_paths(monkeypatch):
    """The shipped graphs were compiled for x86-64-v3 (auto on every shape): traced here to compare,
    or built by a server's engine that runs them, they must be that graph on a Zen 4 too."""
    monkeypatch.delenv(cpu.ENV, raising=False)
    monkeypatch.setattr(cpu, "microarchitecture", lambda: "zen4")
    monkeypatch.setattr(cpu, "virtual_target", lambda: "")
    with cpu.as_shipped():
        for op in cpu.OPS:
            assert cpu.op_paths(op=op) == cpu.OpPaths(one_row="auto", rows="auto")
    assert cpu.op_paths(op="q4_0").one_row == cpu.ONE_ROW["zen4"]["q4_0"].path
    monkeypatch.setattr(cpu, "_as_shipped", False)
    cpu.run_as_shipped()  # the engine's process, for good (monkeypatch restores the flag after)
    assert cpu.op_paths(op="q4_0") == cpu.OpPaths(one_row="auto", rows="auto")
