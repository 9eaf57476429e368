"""The kernels on an AVX2-only CPU, emulated: a check for machines with AVX-512.

Not a pytest module (it needs an emulator, and ~15 min of it): run it by hand
under QEMU's user-mode emulator, which reports the CPU model it is given to
everything that asks (LLVM, so MAX and Mojo, compile for that CPU):

    apt-get download qemu-user-static && dpkg -x qemu-user-static_*.deb /tmp/qemu
    XDG_CACHE_HOME=/tmp/qemu-cache GPT2_MAX_CACHE=/tmp/qemu-cache/gpt2 \\
        /tmp/qemu/usr/bin/qemu-x86_64-static -cpu Haswell .venv/bin/python tests/avx2_under_qemu.py

Use a cache folder of its own (code compiled for this machine's AVX-512 must
not be loaded under an emulated AVX2 CPU). It checks:

1. MAX's own Q4_0 repack (what F.qmatmul runs) packs bands of 16 rows there,
   equal to ``pack_q4_0(blocks, 16)``: the layout q4_0 prompts hand to MAX's
   kernel on such a CPU (model/cpu.py's q4_0_band);
2. the kernels on the CPU's own path (auto: avx2) against numpy: float32,
   Q8_0, and Q4_0 in bands of 32 (this project's band kernel) and 16 (MAX's
   kernel for prompts), for 1 to 60 rows.

``--app ARGS...`` runs the app instead (``python -m model ARGS...``) on the
emulated CPU, e.g. the demo's q4_0 greedy text, the symptom an AVX2-only EPYC once showed
("!!!!" on an AVX2-only EPYC):

    ... qemu-x86_64-static -cpu Haswell .venv/bin/python tests/avx2_under_qemu.py --app \\
        --model demo --dtype q4_0 --temperature 0 --max-new-tokens 12 "And it came to pass"

MAX's kv-cache ops module (``KV_CACHE_OPS`` in model/max_internals.py) is Mojo, which mojo's importer compiles once into
the installed package (``__mojocache__``), natively, i.e. for AVX-512 here; it
is stubbed (neither the kernels' graphs nor the app call it).
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the project, and test_fast_linear's graph
from model.max_internals import KV_CACHE_OPS  # noqa: E402

stub = types.ModuleType(KV_CACHE_OPS)
stub.__getattr__ = lambda name: (lambda *args, **kwargs: None)
sys.modules[KV_CACHE_OPS] = stub

import numpy as np  # noqa: E402

from model import cpu  # noqa: E402

# Under qemu-user /proc/cpuinfo is the host's: tell model/cpu.py the emulated CPU's flags.
cpu.flags = lambda: frozenset("fma avx avx2 f16c bmi1 bmi2".split())


def repack_check() -> bool:
    from max.driver import CPU
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType
    from max.graph.ops.quantized import repack_gguf_quantized_weights
    from max.graph.quantization import QuantizationEncoding

    from model.quantize import pack_q4_0, quantize_q4_0

    blocks = quantize_q4_0(np.random.default_rng(3).standard_normal((64, 128)).astype(np.float32))
    with Graph("q4_0_repack", input_types=[TensorType(DType.uint8, list(blocks.shape), device=DeviceRef.CPU())]) as g:
        g.output(repack_gguf_quantized_weights(g.inputs[0], QuantizationEncoding.Q4_0))
    repacked = InferenceSession(devices=[CPU()]).load(g).execute(blocks)[0].to_numpy().reshape(blocks.shape)
    equal = {band: np.array_equal(repacked, pack_q4_0(blocks, band)) for band in (8, 16, 32)}
    print(f"MAX's Q4_0 repack equals pack_q4_0 in bands of: {[b for b, e in equal.items() if e]} "
          f"(model/cpu.py says {cpu.q4_0_band()})", flush=True)
    return equal[cpu.q4_0_band()]


def kernels_check() -> bool:
    from max.experimental.tensor import Tensor
    from test_fast_linear import compiled_layers

    compiled, arrays, q8_dense, q4_dense, _ = compiled_layers("auto")
    good = True
    for batch, seq in [(1, 1), (1, 3), (2, 5), (1, 17), (3, 20)]:
        r = np.random.default_rng(batch * 100 + seq)
        a = r.standard_normal((batch, seq, 48)).astype(np.float32)
        b = r.standard_normal((batch, seq, 128)).astype(np.float32)
        got = [t.to_numpy() for t in compiled(Tensor.from_dlpack(a), Tensor.from_dlpack(b))]
        want = [a @ arrays["f32.weight"].T + arrays["f32.bias"], b @ q8_dense.T + arrays["q8.bias"],
                b @ q4_dense.T + arrays["q4.bias"], b @ q4_dense.T + arrays["q4.bias"]]
        errors = [float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, want)]
        bounds = [1e-4, 0.01, 0.01, 0.01]  # the quantized ops round the activations to 8 bits
        good &= all(e <= bound for e, bound in zip(errors, bounds))
        print(f"rows {batch * seq:3d}: largest error / largest value: f32 {errors[0]:.1e}, q8_0 {errors[1]:.1e}, "
              f"q4_0 in bands of 32 {errors[2]:.1e}, of 16 {errors[3]:.1e}", flush=True)
    return good


def main() -> int:
    start = time.time()
    print(f"model/cpu.py sees: {cpu.describe()}", flush=True)
    if sys.argv[1:2] == ["--app"]:
        from model.cli import main as app

        code = app(sys.argv[2:])
        print(f"(app exit {code}, {time.time() - start:.0f} s)")
        return code
    ok = repack_check() and kernels_check()
    print(f"{'right' if ok else 'WRONG'} ({time.time() - start:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
