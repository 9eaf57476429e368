"""On a machine with an accelerator: the compiled model on the GPU, in float32
and in bfloat16 (the GPU default), against Hugging Face's reference data.
Skipped (with the reason) where MAX sees no accelerator, as on CI.

On a GPU machine with MAX: ``python -m pytest -ra tests/test_gpu.py``. On a
GPU machine without network or MAX: ``python3.13 -m gpu pack --python 3.N
--installed FILE`` here (the machine's Python and its ``pip list --format=freeze``),
then ``python3 -m gpu receive`` there once per piece and ``python3 -m gpu run
tests`` (docs/gpu.md)."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints import reference

from model.device import accelerator_count

pytestmark = pytest.mark.skipif(accelerator_count() == 0,
                                reason="MAX sees no accelerator on this machine (on a GPU machine: docs/gpu.md)")


# Tolerances relative to the largest logit. float32 on an H100 measured 1.0e-3
# (its matmuls may use TF32's 10-bit mantissa); bfloat16 measured 1.7e-2.
@pytest.mark.parametrize("dtype, tolerance", [("float32", 5e-3), ("bfloat16", 0.05)])
def test_gpu_logits_and_greedy(dtype, tolerance):
    from model.gpt2 import load_gpt2

    folder, _, ref = reference("tiny-2l-4h")
    gpt2 = load_gpt2(folder, device="gpu", dtype=dtype, with_tokenizer=False)
    assert gpt2.placement.kind == "gpu" and gpt2.placement.dtype == dtype
    logits = gpt2.forward_logits(ref["ids"])
    scale = np.abs(ref["logits"]).max()
    error = np.abs(logits - ref["logits"]).max() / scale
    agree = (logits.argmax(-1) == ref["logits"].argmax(-1)).mean()
    print(f"{dtype}: max |error| / max |logit| = {error:.2e}, argmax agreement {agree:.3f}, "
          f"compile {gpt2.compile_seconds:.1f} s")
    assert error <= tolerance
    assert agree >= (1.0 if dtype == "float32" else 0.9)
    # The cached greedy path on the GPU.
    logits, cache = gpt2.step(ref["prompt"], gpt2.empty_cache(1))
    tokens = []
    for _ in range(len(ref["greedy"][0])):
        tokens.append(int(logits[0].argmax()))
        logits, cache = gpt2.step(np.array([[tokens[-1]]]), cache)
    if dtype == "float32":
        assert tokens == ref["greedy"][0].tolist()


def test_serve_on_the_gpu_in_bfloat16(tmp_path):
    """`python -m serve --device gpu`: MAX's engine with this architecture in
    bfloat16; its greedy text agrees with the app's bfloat16 greedy text for
    the first tokens (bfloat16 rounding may part them later)."""
    import json
    import urllib.request

    from conftest import run_python
    from test_serve import MODEL, Server

    server = Server(tmp_path / "server.log", device="gpu")
    try:
        server.wait_ready()
        body = json.dumps({"model": MODEL, "prompt": "And it came to pass", "max_tokens": 8, "temperature": 0})
        request = urllib.request.Request(server.base + "/v1/completions", data=body.encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            served = json.loads(r.read())["choices"][0]["text"]
    finally:
        server.stop()
    app = run_python("-m", "model", "--model", MODEL, "--device", "gpu", "--temperature", "0",
                     "--max-new-tokens", "8", "--json", "And it came to pass")
    assert app.returncode == 0, app.stderr[-2000:]
    app_text = json.loads(app.stdout.strip().splitlines()[-1])["text"]
    assert served.split()[:3] == app_text.split()[:3], (served, app_text)


def test_bfloat16_scores_every_position_of_the_demo():
    """The demo (vocabulary 50257) in bfloat16, every position scored at once
    against the stored HF float32 reference: HF's own bfloat16 on an H200 is
    1.2% from it with every argmax equal (bench.accuracy). The cached path,
    one position per call, is checked by bench.accuracy's greedy run."""
    from checkpoints import demo_reference

    from model.gpt2 import load_gpt2

    ref = demo_reference()
    gpt2 = load_gpt2("demo", device="gpu", dtype="bfloat16", with_tokenizer=False)
    logits = gpt2.forward_logits(ref["ids"])
    error = np.abs(logits - ref["logits"]).max() / np.abs(ref["logits"]).max()
    agree = (logits.argmax(-1) == ref["logits"].argmax(-1)).mean()
    print(f"demo bfloat16, every position: max |error| / max |logit| = {error:.2e}, argmax agreement {agree:.3f}")
    assert error <= 0.05 and agree >= 0.875


def rounded_to_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16's as the build rounds them, as float32."""
    from model.gpt2 import bfloat16_bits

    return (bfloat16_bits(a).astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("vocab", [512, 50257, 50304])
@pytest.mark.parametrize("rows", [1, 8])
def test_a_bfloat16_head_of_one_or_several_rows(rows, vocab):
    """The LM head alone, [rows, 768] @ [vocab, 768]^T in bfloat16 on the
    card, against numpy on the same rounded values: one row is a
    matrix-vector product, several a matmul; 50257 is GPT-2's vocabulary (an
    odd width), 50304 the next multiple of 64, 512 the tiny checkpoint's."""
    from max.driver import CPU, Accelerator
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    from model.gpt2 import as_bfloat16

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 768), dtype=np.float32)
    w = rng.standard_normal((vocab, 768), dtype=np.float32) * 0.05
    device = Accelerator()
    types = [TensorType(DType.bfloat16, list(a.shape), device=DeviceRef.GPU()) for a in (x, w)]
    with Graph("head", input_types=types) as graph:
        a, b = (value.tensor for value in graph.inputs)
        graph.output(ops.cast(a @ ops.transpose(b, 0, 1), DType.float32))
    model = InferenceSession(devices=[device]).load(graph)
    inputs = [buffer.to(device) for buffer in as_bfloat16({"x": x, "w": w}).values()]
    got = model.execute(*inputs)[0].to(CPU()).to_numpy()
    expected = rounded_to_bfloat16(x) @ rounded_to_bfloat16(w).T
    error = np.abs(got - expected).max() / np.abs(expected).max()
    print(f"rows {rows}, vocab {vocab}: max |error| / max |value| = {error:.2e}")
    assert error <= 1e-2
