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
