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

With --hf-python (an interpreter with torch), float32 and bfloat16 are
compared with HF at the same precision on the same device instead, computed
there and then by bench/hf_logits.py: on a GPU, `--device gpu --dtypes float32
bfloat16 --hf-python python3` puts this project's bfloat16 beside HF's
bfloat16 on the same card. The other precisions keep the float32 reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from model.graph_source import USE

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "reference"
CHECKPOINTS = ["demo", "trained-bytes", "tiny-2l-4h", "tiny-3l-3h"]
DEMO = REFERENCE.parent.parent / "weights" / "demo"


def folder_of(name: str) -> Path:
    return DEMO if name == "demo" else REFERENCE / name


def stored_reference(name: str) -> dict:
    """HF float32 on the CPU, made once by the scripts in tests/reference."""
    with np.load(REFERENCE / name / "reference.npz") as data:
        return {k: data[k] for k in data.files}


def hf_reference(python: str, name: str, dtype: str, device: str) -> dict:
    """HF's logits and greedy tokens for the stored inputs, computed now at
    ``dtype`` on ``device`` by bench/hf_logits.py in ``python``."""
    ref = stored_reference(name)
    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(inputs, ids=ref["ids"], prompt=ref["prompt"], new_tokens=ref["greedy"].shape[1])
        done = subprocess.run([python, str(Path(__file__).with_name("hf_logits.py")), str(folder_of(name)),
                               str(inputs), str(outputs), "--device", "cuda" if device == "gpu" else "cpu",
                               "--dtype", dtype], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"hf_logits.py ({dtype} on {device}): "
                               + (done.stderr.strip().splitlines() or ["failed"])[-1])
        with np.load(outputs) as data:
            return dict(ref, logits=data["logits"], greedy=data["greedy"])


def agreement(logits: np.ndarray, reference: np.ndarray) -> dict:
    """The largest |difference| relative to the largest reference logit, and
    the share of positions whose argmax agrees."""
    return {"logit_error": float(np.abs(logits - reference).max() / np.abs(reference).max()),
            "argmax_agreement": float((logits.argmax(-1) == reference.argmax(-1)).mean())}


def measure(name: str, dtype: str, device: str = "cpu", ref: dict | None = None) -> dict:
    """One precision against ``ref`` (default: the stored HF float32
    reference). Against a reference computed now, the row also holds this
    project's logits against the stored one (``vs_stored``): when the two
    disagree, that says which side moved."""
    from model.gpt2 import BuildOptions, load_gpt2

    folder = folder_of(name)
    stored = stored_reference(name)
    ref = ref or stored
    gpt2 = load_gpt2(folder, BuildOptions(device=device, dtype=dtype), with_tokenizer=False)
    logits = gpt2.forward_logits(ref["ids"])
    prompt, greedy = ref["prompt"], ref["greedy"][0]
    forced = gpt2.forward_logits(np.concatenate([prompt, greedy[None, :-1]], axis=1))[0, prompt.shape[1] - 1:]
    out, (step_logits, cache) = [], gpt2.step(prompt, gpt2.empty_cache(1))
    for _ in range(len(greedy)):
        out.append(int(step_logits[0].argmax()))
        step_logits, cache = gpt2.step(np.array([[out[-1]]]), cache)
    prefix = next((i for i, (a, b) in enumerate(zip(out, greedy)) if a != b), len(greedy))
    row = {"checkpoint": name, "dtype": dtype, "device": gpt2.placement.kind, **agreement(logits, ref["logits"]),
            "teacher_forced_agreement": float((forced.argmax(-1) == greedy).mean()),
            "greedy_equal_prefix": prefix, "greedy_tokens": len(greedy),
            "quantized_layers": gpt2.quantized_layers, "layers": 4 * gpt2.config.n_layer + 1}
    if ref is not stored:
        row["vs_stored"] = agreement(logits, stored["logits"])
        row["reference_vs_stored"] = agreement(ref["logits"], stored["logits"])
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", nargs="+", default=["float32", "q8_0", "q4_0", "q4_0m", "q6_k"])
    p.add_argument("--checkpoints", nargs="+", default=CHECKPOINTS, choices=CHECKPOINTS)
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--hf-python", metavar="PYTHON",
                   help="an interpreter with torch: compare float32 and bfloat16 with HF at the same precision on "
                        "the same device, computed now (default: the stored HF float32 reference)")
    args = p.parse_args(argv)
    os.environ[USE] = "0"  # this CPU's own graphs, never one shipped for first runs (model/graph_source.py)
    rows = []
    for name in args.checkpoints:
        for dtype in args.dtypes:
            same = args.hf_python and dtype in ("float32", "bfloat16")
            ref = hf_reference(args.hf_python, name, dtype, args.device) if same else None
            row = measure(name, dtype, args.device, ref)
            row["reference"] = f"hf {dtype} on {args.device}, now" if same else "hf float32 on cpu, stored"
            rows.append(row)
    print(f"{'checkpoint':<15}{'dtype':<9}{'logit error':>12}{'argmax':>9}{'forced':>9}"
          f"{'greedy prefix':>15}{'quantized':>12}")
    for r in rows:
        print(f"{r['checkpoint']:<15}{r['dtype']:<9}{r['logit_error']:>11.2%}{r['argmax_agreement']:>9.1%}"
              f"{r['teacher_forced_agreement']:>9.1%}{r['greedy_equal_prefix']:>9} of {r['greedy_tokens']}"
              f"{r['quantized_layers']:>6} of {r['layers']}  {r['device']}, against {r['reference']}")
    print("(logit error: largest |difference| / largest |logit|; argmax: positions agreeing; forced: greedy steps "
          "agreeing on the reference's own tokens; greedy prefix: tokens equal before the first difference; quantized: "
          "Linear layers + LM head in the quantized format, the others' widths do not fit its blocks)")
    for r in (r for r in rows if "vs_stored" in r):
        ours, theirs = r["vs_stored"], r["reference_vs_stored"]
        print(f"{r['checkpoint']} {r['dtype']}, each against the stored HF float32 reference: this project "
              f"{ours['logit_error']:.2%} / argmax {ours['argmax_agreement']:.1%}, {r['reference']} "
              f"{theirs['logit_error']:.2%} / argmax {theirs['argmax_agreement']:.1%}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
