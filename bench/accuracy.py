"""``python -m bench.accuracy``: how far each precision's logits and greedy
text are from Hugging Face's fp32 reference, on the checkpoints in
tests/reference (made by make_reference.py and make_trained.py) and on the
bundled demo (weights/demo, made by make_demo.py; its reference data is in
tests/reference/demo).

Prints, per checkpoint and precision: the largest |logit difference| as a
fraction of the largest logit, the share of positions whose argmax agrees,
the share of greedy steps that agree when fed the reference's own tokens
(teacher-forced), and how many greedy tokens agree before the first
difference when running free. The tolerances in tests/test_quantize.py come
from this script's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "reference"
CHECKPOINTS = ["demo", "trained-bytes", "tiny-2l-4h", "tiny-3l-3h"]
DEMO = REFERENCE.parent.parent / "weights" / "demo"


def measure(name: str, dtype: str) -> dict:
    from model.gpt2 import BuildOptions, load_gpt2

    folder = DEMO if name == "demo" else REFERENCE / name
    with np.load(REFERENCE / name / "reference.npz") as data:
        ref = {k: data[k] for k in data.files}
    gpt2 = load_gpt2(folder, BuildOptions(device="cpu", dtype=dtype), with_tokenizer=False)
    logits = gpt2.forward_logits(ref["ids"])
    prompt, greedy = ref["prompt"], ref["greedy"][0]
    forced = gpt2.forward_logits(np.concatenate([prompt, greedy[None, :-1]], axis=1))[0, prompt.shape[1] - 1:]
    out, (step_logits, cache) = [], gpt2.step(prompt, gpt2.empty_cache(1))
    for _ in range(len(greedy)):
        out.append(int(step_logits[0].argmax()))
        step_logits, cache = gpt2.step(np.array([[out[-1]]]), cache)
    prefix = next((i for i, (a, b) in enumerate(zip(out, greedy)) if a != b), len(greedy))
    return {"checkpoint": name, "dtype": dtype,
            "logit_error": float(np.abs(logits - ref["logits"]).max() / np.abs(ref["logits"]).max()),
            "argmax_agreement": float((logits.argmax(-1) == ref["logits"].argmax(-1)).mean()),
            "teacher_forced_agreement": float((forced.argmax(-1) == greedy).mean()),
            "greedy_equal_prefix": prefix, "greedy_tokens": len(greedy),
            "quantized_layers": gpt2.quantized_layers, "layers": 4 * gpt2.config.n_layer + 1}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", nargs="+", default=["float32", "q8_0", "q4_0", "q4_0m", "q6_k"])
    p.add_argument("--checkpoints", nargs="+", default=CHECKPOINTS, choices=CHECKPOINTS)
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = p.parse_args(argv)
    rows = [measure(name, dtype) for name in args.checkpoints for dtype in args.dtypes]
    print(f"{'checkpoint':<15}{'dtype':<9}{'logit error':>12}{'argmax':>9}{'forced':>9}{'greedy prefix':>15}{'quantized':>12}")
    for r in rows:
        print(f"{r['checkpoint']:<15}{r['dtype']:<9}{r['logit_error']:>11.2%}{r['argmax_agreement']:>9.1%}"
              f"{r['teacher_forced_agreement']:>9.1%}{r['greedy_equal_prefix']:>9} of {r['greedy_tokens']}"
              f"{r['quantized_layers']:>6} of {r['layers']}")
    print("(logit error: largest |difference| / largest |logit|; argmax: positions agreeing; forced: greedy steps "
          "agreeing on the reference's own tokens; greedy prefix: tokens equal before the first difference; quantized: "
          "Linear layers + LM head in the quantized format, the others' widths do not fit its blocks)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
