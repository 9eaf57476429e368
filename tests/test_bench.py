"""The benchmark's own machinery on a small model (its figures are not tested:
speed targets live in the benchmark, not in timed tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from checkpoints import TINY as SIZES

from bench.__main__ import measure_ours, table
from solutions.solution_01 import GPT2Config
from weights.checkpoint import expected_shapes
from weights.synthetic import write_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def test_measure_and_table(tmp_path):
    folder = write_checkpoint(tmp_path / "m", SIZES, seed=5)
    ours = measure_ours(folder, "float32", "cpu", reps=1, new_tokens=4, prefill=(16, 32), batches=(1, 2))
    assert set(ours["prefill_ms"]) == {"16", "32"} and set(ours["decode_tok_s"]) == {"1", "2"}
    assert ours["ttft_ms"] == ours["prefill_ms"]["16"] and ours["peak_rss_mb"] > 0
    params = sum(np.prod(shape) for shape in expected_shapes(GPT2Config(**SIZES)).values())  # wte counted once: tied
    assert ours["weights_mb"] == pytest.approx(4 * params / 2**20)  # float32: every parameter, 4 bytes
    assert ours["rss_per_weight_byte"] == pytest.approx(ours["peak_rss_mb"] / ours["weights_mb"])
    ours["prefill_ms"]["512"], ours["decode_tok_s"]["8"] = 10.0, 400.0
    hf = {"prefill_ms": {"16": 20.0, "512": 20.0}, "decode_tok_s": {"1": ours["decode_tok_s"]["1"] / 2, "8": 100.0},
          "ttft_ms": 20.0, "peak_rss_mb": ours["peak_rss_mb"]}
    text = table([ours], hf)
    assert "decode, batch 8 (tok/s)" in text and "4.00x" in text and "2.00x" in text  # 400/100, 20/10
    assert "-" in table([ours], None)


def test_on_a_gpu_each_precision_is_compared_with_hf_at_the_same_precision():
    """bench --device gpu measures HF in float32 and bfloat16 on the card; our
    bfloat16 is compared with HF's bfloat16, our float32 with HF's float32."""
    ours = [{"dtype": d, "device": "gpu", "compile_s": 1.0, "start_to_first_token_s": 2.0, "prefill_ms": {"16": 2.0},
             "decode_tok_s": {"1": tok_s}} for d, tok_s in (("float32", 300.0), ("bfloat16", 500.0))]
    hf = [{"dtype": d, "device": "cuda", "prefill_ms": {"16": 4.0}, "decode_tok_s": {"1": tok_s}}
          for d, tok_s in (("float32", 100.0), ("bfloat16", 250.0))]
    text = table(ours, hf)
    header = next(line for line in text.splitlines() if line.startswith("figure"))
    assert "hf float32" in header and "hf bfloat16" in header
    decode = next(line for line in text.splitlines() if line.startswith("decode, batch 1"))
    assert decode.split()[-2:] == ["3.00x", "2.00x"]  # 300/100, 500/250 (not 500/100)


def test_table_compares_llama_cpp_at_the_same_weight_format():
    ours = [{"dtype": d, "device": "cpu", "compile_s": 1.0, "start_to_first_token_s": 2.0, "prefill_ms": {"16": 30.0},
             "decode_tok_s": {"1": tok_s}} for d, tok_s in (("float32", 60.0), ("q6_k", 100.0))]
    llama = [{"dtype": "f32", "prefill_ms": {"16": 15.0}, "decode_tok_s": {"1": 120.0}},
             {"dtype": "q8_0", "prefill_ms": {"16": 10.0}, "decode_tok_s": {"1": 200.0}}]
    text = table(ours, None, llama)
    header = next(line for line in text.splitlines() if line.startswith("figure"))
    assert "llama.cpp f32" in header and "llama.cpp q8_0" in header
    assert "vs l.cpp float32" in header and "vs l.cpp q6_k" not in header  # llama.cpp has no q6_k here
    decode = next(line for line in text.splitlines() if line.startswith("decode, batch 1"))
    assert decode.split()[-1] == "0.50x"  # 60 / 120 tok/s
    prefill = next(line for line in text.splitlines() if line.startswith("prefill 16"))
    assert prefill.split()[-1] == "0.50x"  # 15 / 30 ms


def test_the_4_bit_pairing_is_byte_for_byte(tmp_path, monkeypatch):
    # Our all-Q4_0 model against llama-quantize --pure, our q4_0m (the head in Q6_K)
    # against llama-quantize's default Q4_0 file, which keeps the tied head in Q6_K.
    from bench import llama_cpp

    ours = [{"dtype": d, "device": "cpu", "compile_s": 1.0, "start_to_first_token_s": 2.0, "prefill_ms": {"16": 10.0},
             "decode_tok_s": {"1": tok_s}} for d, tok_s in (("q4_0", 300.0), ("q4_0m", 270.0))]
    llama = [{"dtype": "q4_0", "prefill_ms": {"16": 10.0}, "decode_tok_s": {"1": 270.0}},
             {"dtype": "q4_0-pure", "prefill_ms": {"16": 10.0}, "decode_tok_s": {"1": 200.0}}]
    decode = next(line for line in table(ours, None, llama).splitlines() if line.startswith("decode, batch 1"))
    assert decode.split()[-2:] == ["1.50x", "1.00x"]  # 300 / 200 (pure), 270 / 270 (mixture)
    calls = []
    monkeypatch.setattr(llama_cpp, "_run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setattr("bench.gguf_export.write_gguf", lambda *a: None)
    llama_cpp.gguf_files(tmp_path, tmp_path)
    quantize = {cmd[-2].split("model-")[-1]: cmd for cmd in calls}  # by the file each writes
    assert "--pure" in quantize["q4_0-pure.gguf"] and quantize["q4_0-pure.gguf"][-1] == "Q4_0"
    assert "--pure" not in quantize["q4_0.gguf"] and quantize["q4_0.gguf"][-1] == "Q4_0"


def test_gguf_names_cover_every_weight():
    from bench.gguf_export import gguf_name
    from solutions.solution_01 import GPT2Config
    from weights import expected_shapes

    names = [gguf_name(n) for n in [*expected_shapes(GPT2Config(n_layer=2)), "lm_head.weight"]]
    assert names.count(None) == 1  # the tied head is not written
    written = [n for n in names if n]
    assert len(set(written)) == len(written) == 4 + 2 * 12
    assert {"token_embd.weight", "position_embd.weight", "blk.1.attn_qkv.weight", "blk.0.ffn_down.bias"} <= set(written)


def test_a_failing_precision_is_reported_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    import bench.__main__ as bench
    from bench import llama_cpp

    def fake_child(folder, dtype, device, reps, new_tokens, linear="custom", replay=True):
        if dtype == "q6_k":
            raise RuntimeError("q6_k: something broke")
        return {"dtype": dtype, "device": "cpu", "compile_s": 1.0, "start_to_first_token_s": 2.0,
                "prefill_ms": {"16": 30.0}, "decode_tok_s": {"1": 60.0}}

    monkeypatch.setattr(bench, "measure_ours_in_child", fake_child)
    monkeypatch.setattr(llama_cpp, "built", lambda: None)
    monkeypatch.setattr("model.device.accelerator_count", lambda: 0)  # a CPU-only machine
    monkeypatch.delenv("GPT2_MAX_HF_PYTHON", raising=False)
    monkeypatch.delenv("GPT2_MAX_LLAMA_CPP", raising=False)
    folder = write_checkpoint(tmp_path / "m", SIZES, seed=5)
    out = tmp_path / "r.json"
    assert bench.main(["--model", str(folder), "--device", "auto", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "max float32" in printed and "max q4_0" in printed  # auto on a CPU: the CPU's precisions
    assert "not measured: q6_k: something broke" in printed
    assert [r["dtype"] for r in json.loads(out.read_text())["ours"]] == ["float32", "q8_0", "q4_0", "q4_0m"]


def test_a_gpu_bench_refuses_bfloat16_under_a_faulty_max_and_no_gpu_is_refused_first(tmp_path, monkeypatch, capsys):
    """On a GPU the bench measures float32, and bfloat16 beside it only under
    a MAX not known to compute it wrong; asked for under a faulty one, it is
    refused naming MAX's fault, before anything is measured. Every GPU run
    measures the card's read bandwidth and gives the weights' reads as a share
    of it; HF runs eager and compiled there. --device gpu where MAX sees none
    is refused first. --no-replay reaches each precision's child."""
    import bench.__main__ as bench
    from bench import llama_cpp

    measured, hf_runs = [], []

    def fake_child(folder, dtype, device, reps, new_tokens, linear="custom", replay=True):
        measured.append((dtype, replay))
        return {"dtype": dtype, "device": device, "compile_s": 1.0, "start_to_first_token_s": 2.0,
                "prefill_ms": {"16": 3.0}, "decode_tok_s": {"1": 600.0}, "weight_gb_s": 300.0, "replay": replay}

    def fake_hf(python, folder, reps, new_tokens, device, dtype, mode):
        hf_runs.append((dtype, mode))
        return {"dtype": dtype, "mode": mode, "device": "cuda", "decode_tok_s": {"1": 200.0}, "weight_gb_s": 100.0}

    monkeypatch.setattr(bench, "measure_ours_in_child", fake_child)
    monkeypatch.setattr(bench, "measure_hf", fake_hf)
    monkeypatch.setattr(bench, "card_read_gb_s", lambda: 4000.0)
    monkeypatch.setattr(llama_cpp, "built", lambda: None)
    monkeypatch.delenv("GPT2_MAX_HF_PYTHON", raising=False)
    monkeypatch.delenv("GPT2_MAX_LLAMA_CPP", raising=False)
    folder = write_checkpoint(tmp_path / "m", SIZES, seed=5)
    monkeypatch.setattr("model.device.accelerator_count", lambda: 0)
    with pytest.raises(SystemExit):
        bench.main(["--model", str(folder), "--device", "gpu", "--json", str(tmp_path / "none.json")])
    assert "MAX sees no accelerator" in capsys.readouterr().err and measured == []
    monkeypatch.setattr("model.device.accelerator_count", lambda: 1)
    monkeypatch.setattr("model.device.bfloat16_fault", lambda: "MAX's fault (modular/modular#6883)")
    with pytest.raises(SystemExit):
        bench.main(["--model", str(folder), "--device", "gpu", "--dtypes", "bfloat16", "--json", str(tmp_path / "b")])
    assert "modular/modular#6883" in capsys.readouterr().err and measured == []
    out = tmp_path / "r.json"
    assert bench.main(["--model", str(folder), "--device", "gpu", "--hf-python", "python", "--json", str(out)]) == 0
    assert measured == [("float32", True)] and hf_runs == [("float32", "eager"), ("float32", "compiled")]
    printed = capsys.readouterr().out
    assert "the card reads 4000 GB/s" in printed and "decode replayed from a captured device graph" in printed
    share = next(line for line in printed.splitlines() if line.strip().startswith("of the card's read"))
    assert share.split()[5:8] == ["7.5", "2.5", "2.5"]  # 300, 100 and 100 GB/s of 4000
    header = next(line for line in printed.splitlines() if line.startswith("figure"))
    assert "hf float32 compiled" in header and "vs hf float32 compiled" in header
    assert json.loads(out.read_text())["card_read_gb_s"] == 4000.0
    monkeypatch.setattr("model.device.bfloat16_fault", lambda: None)  # a MAX that computes it right
    measured.clear()
    assert bench.main(["--model", str(folder), "--device", "gpu", "--no-replay", "--json", str(out)]) == 0
    assert measured == [("float32", False), ("bfloat16", False)]


def test_hf_s_command_names_its_mode_and_device():
    from bench.__main__ import hf_command

    command = hf_command("py", Path("m"), 3, 128, "gpu", "float32", "compiled")
    assert command[:2] == ["py", str(ROOT / "bench" / "hf_baseline.py")]
    assert " ".join(command[2:]).endswith("--device cuda --dtype float32 --mode compiled")


def test_rounds_are_merged_into_medians_and_each_round_s_ratio_is_printed(tmp_path, monkeypatch, capsys):
    # --rounds N alternates this project and llama.cpp N times: the table shows
    # each figure's median across the rounds, and a line per precision gives
    # every round's own ratio (both sides measured minutes apart).
    import bench.__main__ as bench
    from bench import llama_cpp

    speed = iter([60.0, 90.0, 75.0])  # our float32 decode in rounds 1, 2, 3

    def fake_child(folder, dtype, device, reps, new_tokens, linear="custom", replay=True):
        return {"dtype": dtype, "device": "cpu", "linear": linear, "compile_s": 1.0, "start_to_first_token_s": 2.0,
                "prefill_ms": {"16": 30.0}, "decode_tok_s": {"1": next(speed)}}

    theirs = iter([100.0, 100.0, 50.0])  # llama.cpp f32 decode in the same rounds

    def fake_llama(bin_dir, folder, reps, new_tokens, precisions):
        assert precisions == {"f32"}  # only the files paired with what is measured of ours
        return [{"dtype": "f32", "prefill_ms": {"16": 60.0}, "decode_tok_s": {"1": next(theirs)}}]

    monkeypatch.setattr(bench, "measure_ours_in_child", fake_child)
    monkeypatch.setattr(llama_cpp, "measure", fake_llama)
    monkeypatch.delenv("GPT2_MAX_HF_PYTHON", raising=False)
    folder = write_checkpoint(tmp_path / "m", SIZES, seed=5)
    out = tmp_path / "r.json"
    argv = ["--model", str(folder), "--dtypes", "float32", "--rounds", "3", "--llama-cpp", str(tmp_path),
            "--json", str(out)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["ours"][0]["decode_tok_s"]["1"] == 75.0  # median of 60, 90, 75
    assert saved["llama_cpp"][0]["decode_tok_s"]["1"] == 100.0
    assert len(saved["rounds"]) == 3
    # rounds: 0.60x, 0.90x, 1.50x (median 0.90x), where the medians' ratio would say 0.75x
    assert "float32 vs llama.cpp f32, per round: prefill 16 tokens 2.00 / 2.00 / 2.00 (median 2.00x); " \
           "decode, batch 1 0.60 / 0.90 / 1.50 (median 0.90x)" in printed
    assert "0.75x" in printed  # the table: the medians' ratio


def test_serve_bench_table_prints_the_ratio_to_llama_server():
    from bench.serve import table

    ours = [{"concurrency": 8, "requests_per_s": 2.0, "output_tokens_per_s": 120.0, "ttft_p50_ms": 50.0,
             "ttft_p99_ms": 90.0}]
    llama = [{"concurrency": 8, "requests_per_s": 1.0, "output_tokens_per_s": 100.0, "ttft_p50_ms": 40.0,
              "ttft_p99_ms": 60.0}]
    text = table(ours, llama)
    assert "| 8 | MAX serve (this project) | 2.000 | 120.0 | 50.0 | 90.0 | 1.20x |" in text
    assert "| 8 | llama-server | 1.000 | 100.0 | 40.0 | 60.0 |  |" in text
    assert "n/a" in table(ours, None)
    # medians across rounds are floats: printed rounded, the concurrency as a count
    merged = [dict(ours[0], concurrency=8.0, requests_per_s=2.0490000000000004)]
    assert "| 8 | MAX serve (this project) | 2.049 | 120.0 |" in table(merged, None)
    # failed requests are named under the table; none, no line
    assert "failed" not in text
    lost = [dict(llama[0], requests=60, failed=4)]
    assert "llama-server at 8 clients: 4 of 64" in table([dict(ours[0], requests=16, failed=0)], lost)


def test_rounds_take_start_and_memory_from_warm_processes():
    """A round that compiled its graph is no start: its start and peak
    memory are left out when another round loaded the saved graph."""
    from bench.__main__ import merge_rounds

    def result(saved, start, peak, tok_s):
        return {"dtype": "float32", "saved_graph": saved, "compile_s": 60.0 if not saved else 0.1,
                "load_s": start, "start_to_first_token_s": start, "peak_rss_mb": peak, "decode_tok_s": {"1": tok_s}}

    [merged] = merge_rounds([[result(False, 70.0, 2000.0, 40.0)], [result(True, 0.6, 700.0, 44.0)],
                             [result(True, 0.8, 720.0, 42.0)]])
    assert (merged["start_to_first_token_s"], merged["peak_rss_mb"], merged["compile_s"]) == (0.7, 710.0, 0.1)
    assert merged["decode_tok_s"]["1"] == 42.0  # speed: every round
    [cold] = merge_rounds([[result(False, 70.0, 2000.0, 40.0)]])  # no warm round: what there is
    assert cold["start_to_first_token_s"] == 70.0


def test_serve_bench_rounds_give_medians_and_each_round_s_ratio():
    from bench.__main__ import merge_rounds
    from bench.serve import round_ratios

    def row(server, tokens_s):
        return {"server": server, "concurrency": 8, "requests_per_s": tokens_s / 64, "output_tokens_per_s": tokens_s,
                "ttft_p50_ms": 50.0, "ttft_p99_ms": 90.0}

    rounds = [([row("max-serve", 100.0)], [row("llama-server", 200.0)]),
              ([row("max-serve", 180.0)], [row("llama-server", 200.0)]),
              ([row("max-serve", 150.0)], [row("llama-server", 100.0)])]
    merged = merge_rounds([ours for ours, _ in rounds], key="concurrency")
    assert merged == [row("max-serve", 150.0)]
    assert round_ratios(rounds) == ["8 clients, output tokens/s vs llama-server per round: 0.50 / 0.90 / 1.50 "
                                    "(median 0.90x)"]


def test_serve_bench_names_its_baseline():
    """With --hf-python the baseline is HF's generate in a loop (a GPU has no llama.cpp here)."""
    from bench.serve import round_ratios
    from bench.serve import table as serve_table

    def row(tokens_s):
        return {"concurrency": 1, "requests_per_s": 1.0, "output_tokens_per_s": tokens_s, "ttft_p50_ms": 5.0,
                "ttft_p99_ms": 9.0}

    text = serve_table([row(300.0)], [row(100.0)], "HF generate, one at a time")
    assert "tokens/s vs HF generate, one at a time" in text and "| 1 | HF generate, one at a time |" in text
    assert "3.00x" in text and "llama" not in text
    assert round_ratios([([row(300.0)], [row(100.0)])], "HF generate")[0].startswith(
        "1 clients, output tokens/s vs HF generate")


HF_PYTHON = os.environ.get("GPT2_MAX_HF_PYTHON")


@pytest.mark.skipif(not HF_PYTHON, reason="needs an interpreter with torch + transformers: GPT2_MAX_HF_PYTHON")
def test_hf_s_compiled_generation_runs_compiled_and_its_eager_one_does_not(tmp_path):
    """bench/hf_baseline.py's two modes on a tiny checkpoint, on the CPU (the
    GPU run passes --device cuda): the compiled one's forward ran as graphs
    torch.compile made, the eager one's as Python; both give figures."""
    from bench.__main__ import measure_hf

    folder = write_checkpoint(tmp_path / "m", dict(SIZES, vocab_size=512, n_positions=1024), seed=5)  # 512 prefilled
    eager, compiled = (measure_hf(HF_PYTHON, folder, 1, 6, "cpu", "float32", mode) for mode in ("eager", "compiled"))
    assert eager["mode"] == "eager" and eager["compiled_graphs"] == 0
    assert compiled["mode"] == "compiled" and compiled["compiled_graphs"] >= 1
    assert compiled["decode_tok_s"]["1"] > 0 and compiled["weight_gb_s"] > 0


@pytest.mark.skipif(not HF_PYTHON, reason="needs an interpreter with torch + transformers: GPT2_MAX_HF_PYTHON")
def test_the_hf_baselines_run_on_the_demo(tmp_path):
    """bench/hf_server.py answers bench.serve's streamed requests with HF's
    greedy text, 32 clients at once too, and bench/hf_logits.py gives the stored reference's logits
    (the scripts the GPU run uses with --device cuda; here on the CPU)."""
    from bench.serve import free_port, one_request, run_load, wait_ready
    from weights import load_tokenizer

    demo = ROOT / "weights" / "demo"
    with np.load(ROOT / "tests" / "reference" / "demo" / "reference.npz") as data:
        ref = {k: data[k] for k in data.files}
    np.savez(tmp_path / "in.npz", ids=ref["ids"], prompt=ref["prompt"], new_tokens=ref["greedy"].shape[1])
    done = subprocess.run([HF_PYTHON, str(ROOT / "bench" / "hf_logits.py"), str(demo), str(tmp_path / "in.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    with np.load(tmp_path / "out.npz") as out:
        assert np.abs(out["logits"] - ref["logits"]).max() <= 1e-4 * np.abs(ref["logits"]).max()
        assert (out["greedy"] == ref["greedy"]).all()
    port = free_port()
    server = subprocess.Popen([HF_PYTHON, str(ROOT / "bench" / "hf_server.py"), str(demo), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
                              env=dict(os.environ))  # not MAX's C-level PYTHONPATH (tests/conftest.py's run_python)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, server, 120, "hf_server")
        tokenizer = load_tokenizer(demo)
        prompt = tokenizer.decode([int(t) for t in ref["prompt"][0]])
        answer = one_request(base, "demo", prompt, 8, tokenizer)
        assert answer["tokens"] == 8 and answer["ttft"] <= answer["seconds"]
        body = json.dumps({"prompt": prompt, "max_tokens": 8, "temperature": 0}).encode()
        request = urllib.request.Request(base + "/v1/completions", data=body)
        with urllib.request.urlopen(request, timeout=60) as r:
            text = json.loads(r.read())["choices"][0]["text"]
        assert text == tokenizer.decode([int(t) for t in ref["greedy"][0][:8]])
        # bench.serve's largest load, 32 clients connecting at once: every one answered
        row = run_load(base, "demo", [prompt] * 65, 2, 32, tokenizer)
        assert (row["requests"], row["failed"]) == (64, 0)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_serve_bench_counts_a_dropped_connection_as_a_failed_request():
    """A server that closes some connections unanswered (what an overflowing
    listen queue gives 32 clients): bench.serve counts them in "failed" and
    measures the rest, instead of stopping the whole bench."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bench.serve import run_load

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            prompt = json.loads(self.rfile.read(int(self.headers["content-length"])))["prompt"]
            if prompt == "dropped":
                self.close_connection = True
                return  # no status line: the client reads an empty reply
            self.send_response(200)
            self.end_headers()
            for chunk in ({"choices": [{"text": "a"}]}, {"choices": [], "usage": {"completion_tokens": 3}}):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        row = run_load(base, "fake", ["warm", "kept", "dropped", "kept", "dropped", "kept"], 3, 4, tokenizer=None)
    finally:
        server.shutdown()
    assert (row["requests"], row["failed"]) == (3, 2)
    assert row["output_tokens_per_s"] > 0


def test_serve_bench_fits_its_prompts_to_the_window():
    from bench.serve import PROMPT_TOKENS, prompt_lengths

    assert prompt_lengths(1024, 64) == PROMPT_TOKENS
    small = prompt_lengths(256, 64)  # the demo
    assert all(2 * n + 64 + 16 <= 256 for n in small) and small[0] < small[-1]


def test_serve_bench_prompts_are_fixed_and_mixed():
    from bench.serve import PROMPT_TOKENS, prompts
    from weights import load_tokenizer
    from weights.resolve import DEMO

    tokenizer = load_tokenizer(DEMO)
    a, b = prompts(tokenizer, 8), prompts(tokenizer, 8)
    assert a == b and len(set(a)) == 8
    lengths = [len(tokenizer(t)["input_ids"]) for t in a[:len(PROMPT_TOKENS)]]
    assert lengths == sorted(lengths) and lengths[0] >= PROMPT_TOKENS[0]


def test_serve_bench_never_sends_a_prompt_twice_in_a_round():
    # The same 16 prompts at every concurrency let llama-server skip their prefill
    # (its log: "selected slot by LCP similarity, f_sim_best = 1.000", 1 token evaluated):
    # its time to first token was then a cache hit's.
    from bench.serve import level_prompts
    from weights import load_tokenizer
    from weights.resolve import DEMO

    tokenizer = load_tokenizer(DEMO)
    first = level_prompts(tokenizer, (1, 8, 32), (4, 8), round_number=0)
    assert first == level_prompts(tokenizer, (1, 8, 32), (4, 8), round_number=0)  # both servers get the same
    assert [len(first[c]) for c in (1, 8, 32)] == [17, 17, 65]  # a warm-up prompt, then the requests
    sent = [text for c in (1, 8, 32) for text in first[c]]
    assert len(set(sent)) == len(sent)
    later = level_prompts(tokenizer, (1, 8, 32), (4, 8), round_number=1)
    assert not set(sent) & {text for texts in later.values() for text in texts}


def test_kernels_against_gives_the_other_revisions_ops_the_parameters_they_declare():
    # --against REV calls REV's ops with this tree's compile-time parameters that they declare: a
    # revision since the kernel paths takes `isa` (q4_0 `band` too), one since the path per shape
    # `isa1` too, one since q4_0's prefetch per microarchitecture q4_0's `ahead` too, an older one
    # none. Called with none, an op that declares one fails to compile ("Failed to infer parameter
    # `isa`").
    import subprocess

    from bench.kernels import THEN, op_parameters, takes

    if not (ROOT / ".git").exists():
        pytest.skip("no git history here")

    def git_log(*args: str) -> list[str]:
        return subprocess.run(["git", "log", "--format=%H", *args, "--", "model/kernels"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.split()

    assert set(op_parameters("q8_0")) == {"isa", "isa1"}
    assert set(op_parameters("q4_0")) == {"isa", "isa1", "band", "ahead"}
    ahead = git_log("-S", "ahead: Int")  # the commit that added q4_0's prefetch parameter, once committed
    if ahead:
        assert takes(f"{ahead[-1]}~1") == {"isa", "isa1", "band"}
        assert set(op_parameters("q4_0" + THEN, then_takes=takes(f"{ahead[-1]}~1"))) == {"isa", "isa1", "band"}
    per_shape = git_log("-S", "isa1: Int")  # the commit that added the one-row path, once committed
    before = f"{per_shape[-1]}~1" if per_shape else "HEAD"
    assert takes(before) == {"isa", "band"}
    assert set(op_parameters("q8_0" + THEN, then_takes=takes(before))) == {"isa"}
    assert set(op_parameters("q4_0" + THEN, then_takes=takes(before))) == {"isa", "band"}
    first = git_log("--reverse")[0]
    assert takes(first) == frozenset()
    assert op_parameters("q4_0" + THEN, then_takes=takes(first)) is None


def test_kernels_against_renames_every_op_of_the_other_revision():
    # bench.kernels --against REV loads REV's model/kernels beside this
    # tree's: each of its ops and structs must get the THEN name that
    # bench.kernels.graph calls (few_rows_matmul_<kind>_then), and nothing else.
    import re

    from bench.kernels import THEN, renamed
    from model.layers.custom_op import KERNELS

    source = (KERNELS / "matmul.mojo").read_text()
    ops = re.findall(r'@extensibility\.register\("(\w+)"\)', source)
    structs = re.findall(r"^struct (\w+)", source, re.M)
    assert ops == ["few_rows_matmul_f32", "few_rows_matmul_q8_0"] and len(structs) == 2
    other = renamed(source)
    assert re.findall(r'@extensibility\.register\("(\w+)"\)', other) == [op + THEN for op in ops]
    assert re.findall(r"^struct (\w+)", other, re.M) == [name + "Then" for name in structs]
    assert other.replace(THEN, "").replace("Then:", ":") == source


def test_kernels_chain_feeds_each_matmul_from_the_one_before():
    # bench.kernels --chain: every matmul's input is the previous output (its
    # first in_dim columns, scaled), so each waits for the one before; without
    # it, only a width that x does not have (c_fc into mlp c_proj) is chained.
    # The numpy reference follows the same rule as the graph.
    import numpy as np

    from bench.kernels import STEP_SHAPES, chained, reference

    x = np.ones((1, 768), np.float32)
    c_attn_out, c_fc_out = np.arange(2304.0)[None], np.arange(3072.0)[None]
    assert chained(x, [], 768, chain=True) is x
    assert chained(x, [c_attn_out], 768) is x
    np.testing.assert_array_equal(chained(x, [c_attn_out], 768, chain=True), c_attn_out[:, :768] * 0.01)
    np.testing.assert_array_equal(chained(x, [c_fc_out], 3072), c_fc_out * 0.01)
    rng = np.random.default_rng(0)
    shapes = STEP_SHAPES[:4]
    dense = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    h, want = x, []
    for w in dense:
        want.append(h[:, :w.shape[1]] @ w.T)
        h = want[-1] * 0.01
    for got, expected in zip(reference(x, dense, shapes, chain=True), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    independent = reference(x, dense, shapes)
    np.testing.assert_allclose(independent[1], x @ dense[1].T, rtol=1e-5)  # attn c_proj from x, not from c_attn


def test_kernels_epilogue_adds_each_bias_and_gelu_only_after_c_fc():
    # bench.kernels --epilogue: as in the model, each product + its bias, and
    # gelu (tanh form) only where the matmul widens 4x (c_fc); the numpy
    # reference the graph's results are checked against follows that rule.
    import numpy as np

    from bench.kernels import STEP_SHAPES, gelu, reference

    rng = np.random.default_rng(0)
    shapes = STEP_SHAPES[:4]  # c_attn, attn c_proj, c_fc, mlp c_proj
    dense = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    biases = [rng.standard_normal(s[0], dtype=np.float32) for s in shapes]
    x = rng.standard_normal((2, 768), dtype=np.float32)
    plain = reference(x, dense, shapes)
    got = reference(x, dense, shapes, biases=biases)
    for i in (0, 1):
        np.testing.assert_allclose(got[i], plain[i] + biases[i], rtol=1e-6)
    np.testing.assert_allclose(got[2], gelu(plain[2] + biases[2]), rtol=1e-6)
    np.testing.assert_allclose(got[3], (got[2] * 0.01) @ dense[3].T + biases[3], rtol=1e-5)  # fed from c_fc's gelu
    assert np.isclose(gelu(np.float32(1.0)), 0.841192, atol=1e-6) and gelu(np.float32(0.0)) == 0


def test_arithmetic_peak_is_measured_on_one_core_and_on_every_core(capsys):
    # The figures are not tested (speed lives in the bench); that the Mojo
    # program builds with the wheel's compiler and runs on one core and on
    # all, is; the bound it prints is report()'s, tested below.
    import os

    from bench import arithmetic

    assert arithmetic.main([]) == 0
    out = capsys.readouterr().out
    rates = {line.split(": ")[0]: float(line.split(": ")[1].split()[0])
             for line in out.splitlines() if line.startswith("float32 multiply-adds")}
    cores = os.cpu_count()
    assert set(rates) == ({"float32 multiply-adds, 1 core"}
                          | ({f"float32 multiply-adds, {cores} cores"} if cores > 1 else set()))
    assert all(rate > 0 for rate in rates.values())
    assert out.count("needs at least") == 1


def test_the_arithmetic_bound_is_the_prompt_s_multiply_adds_at_the_best_rate():
    # 16 rows x 84,934,656 multiply-adds at 100 G/s (the better core count) = 13.59 ms.
    from bench import arithmetic

    out = arithmetic.report({1: 50.0, 2: 100.0})
    assert "float32 multiply-adds, 1 core: 50.0 G/s" in out and "float32 multiply-adds, 2 cores: 100.0 G/s" in out
    assert "needs at least 13.6 ms of arithmetic" in out


def test_sections_times_the_same_bytes_as_one_section_as_49_and_with_spinning_barriers(capsys):
    # The figures are not tested (speed lives in the bench); that the Mojo
    # program and the op library build and run, read a decode step's 49
    # matmuls' bytes, and that the per-boundary costs printed follow from
    # their times, is.
    import re

    from bench import sections

    assert sections.main(["--passes", "3"]) == 0
    out = capsys.readouterr().out
    assert "(GPT-2 124M's 49 matmuls, 494 MB)" in out  # 123,532,032 float32 weights: the blocks' matmuls and the head
    # Two ms figures printed to 0.01 ms (0.005 each way) over 48 boundaries, and the
    # per-boundary figure printed to 0.1 us: the largest honest difference.
    rounding = 2 * 0.005 * 1e3 / 48 + 0.05
    one = float(re.search(r"one parallel section: +([\d.]+) ms", out).group(1))
    for what in ("one section per matmul \\(MAX's runtime\\):", "one section, spinning barriers between:"):
        ms, per = re.search(what + r" +([\d.]+) ms: ([+-][\d.]+) us a boundary", out).groups()
        assert abs((float(ms) - one) * 1e3 / 48 - float(per)) <= rounding
    assert float(re.search(r"empty parallel section, back to back: +([\d.]+) us", out).group(1)) > 0
    # The same loop as a MAX custom op, in a graph: one op, then 49 in a
    # chain, with MAX's background threads as MAX leaves them and quieted.
    graph = out.split("in a graph")[1]
    assert graph.count("one op over all the bytes:") == graph.count("one op per matmul, each after the last:") == 2
    for part in graph.split("MAX's background threads")[1:]:
        one = float(re.search(r"one op over all the bytes: +([\d.]+) ms", part).group(1))
        ms, per = re.search(r"each after the last: +([\d.]+) ms: ([+-][\d.]+) us a boundary", part).groups()
        assert abs((float(ms) - one) * 1e3 / 48 - float(per)) <= rounding
    # A boundary taken apart from the stamped ops: four parts, each a
    # duration (a stamp out of order would make one negative), and their sum.
    apart = out.split("taken apart")[1]
    parts = [float(us) for us in re.findall(r"-> .+? +(-?[\d.]+) us  \(", apart)]
    assert len(parts) == 4 and all(us >= 0 for us in parts)
    total = float(re.search(r"to the next op reading: +([\d.]+) us", apart).group(1))
    assert abs(sum(parts) - total) < 0.3  # rounding of the printed parts


def test_sections_alternates_priorities_only_where_it_may_raise_one_back():
    # Privileged: blocks of BLOCK calls, nice 0 and 19 in turn, passes
    # rounded up to whole blocks. Unprivileged (no CAP_SYS_NICE, as on most
    # desktops): MAX's threads left as they are for every call first, then
    # lowered once, never raised back (which would fail).
    from bench.sections import BLOCK, priority_blocks
    from model.engine_threads import LOWEST

    assert priority_blocks(BLOCK + 1, alternate=True) == [("", 0, BLOCK), ("_quiet", LOWEST, BLOCK)] * 2
    assert priority_blocks(7, alternate=False) == [("", None, 7), ("_quiet", LOWEST, 7)]


def test_boundary_parts_reads_the_stamped_ops_times():
    # Two chained ops of two tasks, stamped in ns as op.mojo's stamped op
    # writes them: the parts are the gaps between them, the first op's
    # start and the last op's end left out (they border no other op).
    import numpy as np

    from bench.sections import STAMP_TASKS, boundary_parts

    def op(called, starts, ends, returned):
        row = np.zeros(4 + 2 * STAMP_TASKS)
        row[:3] = called, returned, len(starts)
        row[4:4 + len(starts)], row[4 + STAMP_TASKS:4 + STAMP_TASKS + len(ends)] = starts, ends
        return row

    stamps = np.stack([[op(0, [9_000, 99_000], [50_000, 52_000], 55_000),  # start 9 us: the first op's, left out
                        op(62_000, [70_000, 71_000], [120_000, 125_000], 99_000_000)]])
    assert boundary_parts(stamps) == {"first_idle": 2.0, "join": 3.0, "dispatch": 7.0, "start": 8.0}


def test_bandwidth_reads_with_numpy_and_with_a_compiled_max_graph(capsys):
    # Its figures are not tested (speed lives in the bench); that both ways
    # run and the bound printed is the best of them is.
    from bench import bandwidth

    assert bandwidth.main(["--gib", "0.01", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    figures = {line.split(": ")[0]: float(line.split(": ")[1].split()[0])
               for line in out.splitlines() if line.startswith("read bandwidth")}
    assert set(figures) == {"read bandwidth, numpy sum, 1 thread", "read bandwidth, numpy sum, 2 threads",
                            "read bandwidth, a compiled MAX reduction, every core"}
    assert all(gbs > 0 for gbs in figures.values())
    assert f"({max(figures.values()):.1f} GB/s)" in out


def test_cold_start_reports_a_first_runs_figures(tmp_path, monkeypatch):
    # --cold-compile's child, run here with this run's caches (a cold one costs minutes: the
    # graph of SIZES is the app tests' own, compiled once): it must load, answer a first prompt
    # and report its compile, start to first token and peak memory.
    import subprocess

    import bench.__main__ as bench_main

    folder = write_checkpoint(tmp_path / "m", SIZES, seed=5)
    seen = {}
    real_run = subprocess.run
    this_run = bench_main.os.environ.get("XDG_CACHE_HOME")

    def warm_run(cmd, **kw):
        seen["env"] = kw["env"]
        kw["env"] = {k: v for k, v in kw["env"].items() if k != "XDG_CACHE_HOME"}
        if this_run is not None:
            kw["env"]["XDG_CACHE_HOME"] = this_run
        return real_run(cmd, **kw)

    monkeypatch.setenv("GPT2_MAX_SAVED_GRAPHS", "0")  # a user's setting must not reach the first run
    monkeypatch.setattr(bench_main.subprocess, "run", warm_run)
    cold = bench_main.cold_start(folder, "float32")
    assert seen["env"]["XDG_CACHE_HOME"] != bench_main.os.environ.get("XDG_CACHE_HOME")  # empty caches asked for
    assert "GPT2_MAX_CACHE" not in seen["env"] and "GPT2_MAX_SAVED_GRAPHS" not in seen["env"]  # kept, as a first run
    assert cold["cold_start_to_first_token_s"] >= cold["cold_compile_s"] >= 0 and cold["cold_peak_rss_mb"] > 100
    ours = {"dtype": "float32", "device": "cpu", "compile_s": 1.0, "start_to_first_token_s": 2.0, **cold}
    assert "with empty caches: compile" in table([ours], None)


def test_cold_start_failure_names_the_precision(monkeypatch):
    import subprocess

    import bench.__main__ as bench_main

    monkeypatch.setattr(bench_main.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, -9, stdout="", stderr=""))  # killed, silent
    with pytest.raises(RuntimeError, match=r"q8_0 \(first run, exit -9\): no output"):
        bench_main.cold_start(Path("/nowhere"), "q8_0")


def test_a_mojo_program_is_built_once_per_source(tmp_path, monkeypatch):
    """The bench's Mojo programs are built into the cache folder, named by
    their sources, and for this CPU (they were built again at every run)."""
    from bench import mojo_program

    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "hello.mojo"
    source.write_text('def main():\n    print("hello 1")\n')
    binary = mojo_program.built(source)
    assert binary.parent == tmp_path / "cache" / "programs" and mojo_program.run(source) == "hello 1\n"
    assert mojo_program.built(source).stat().st_mtime_ns == binary.stat().st_mtime_ns  # reused, not rebuilt
    source.write_text('def main():\n    print("hello 2")\n')
    assert mojo_program.built(source) != binary and mojo_program.run(source) == "hello 2\n"
    from artifacts.atomic import STAGING

    assert not list(binary.parent.glob(STAGING + "*"))  # no staging folder left
    # The two programs, each with its digest beside it.
    assert len([p for p in binary.parent.iterdir() if p.suffix != ".sha256"]) == 2


def test_the_serving_bench_measures_this_cpus_own_graphs(tmp_path):
    """bench.serve starts the server on this CPU's own graphs, never the ones shipped for a first
    start (x86-64-v3's, whose kernels are the avx2 ones on an AVX-512 CPU), as the app's bench does."""
    from bench.serve import ours_env
    from model import graph_source as portable
    from serve import step_times

    assert ours_env() == {portable.USE: "0"}
    assert ours_env(tmp_path / "steps.jsonl") == {portable.USE: "0", step_times.VARIABLE: str(tmp_path / "steps.jsonl")}
    assert ours_env(graphs="shipped") == {portable.USE: "1"}  # --graphs shipped: what a first start gets


def test_portable_alternates_the_two_graphs_and_checks_each_ran_the_graph_meant(tmp_path, monkeypatch, capsys):
    """bench.portable: the shipped graph against this CPU's own, alternated; a run that
    used the other graph, or tokens that differ, fail it (the real runs: the bench itself)."""
    import subprocess

    from bench import portable
    from weights import load_tokenizer, resolve_model

    real_run_app, calls, prompts = portable.run_app, [], set()

    def run_app(graph, model, new_tokens, folder, prompt=portable.PROMPT):
        assert model == resolve_model("demo")  # the demo's own checkpoint
        calls.append(graph)
        prompts.add(prompt)
        rate = {"shipped": 100.0, "own": 150.0}[graph] + len(calls)
        return {"decode_tokens_per_s": rate, "prefill_ms": 10.0, "compile_s": 0.0, "tokens": [1, 2, 3],
                "prompt_tokens": 5}

    monkeypatch.setattr(portable, "run_app", run_app)
    monkeypatch.setattr(portable, "why_not_here", lambda facts: "")
    assert portable.main(["--rounds", "3", "--json", str(tmp_path / "p.json")]) == 0
    # each untimed first, then the order swapped every round
    assert calls == ["shipped", "own", "shipped", "own", "own", "shipped", "shipped", "own"]
    out = capsys.readouterr().out
    assert "own / shipped decode: 1.4" in out and "prefill: 1.00x as fast; the same tokens: yes" in out
    assert prompts == {portable.PROMPT}
    assert "3 rounds, a prompt of 5 tokens, 128 new tokens" in out
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["medians"]["own"]["decode_tokens_per_s"] == 155.0 and written["prompt_tokens"] == 5
    monkeypatch.setattr(portable, "run_app",
                        lambda graph, model, n, folder, prompt: {**run_app(graph, model, n, folder, prompt),
                                                                 "tokens": [len(calls)]})
    assert portable.main(["--rounds", "1"]) == 1 and "the same tokens: NO" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        portable.main(["--rounds", "0"])
    # a longer prompt: the phrase repeated, cut to as many tokens as asked
    monkeypatch.setattr(portable, "run_app", run_app)
    prompts.clear()
    assert portable.main(["--rounds", "1", "--prompt-tokens", "37"]) == 0
    [prompt] = prompts
    assert prompt.startswith(portable.PROMPT + " " + portable.PROMPT)
    assert len(load_tokenizer(Path(resolve_model("demo"))).encode(prompt)) == 37

    # run_app reads the app's stderr: "not using the shipped ..." is not using it
    line = '{"tokens": [1], "decode_tokens_per_s": 1.0, "prefill_ms": 1.0, "compile_s": 0.0}'
    said = {}

    def app(command, **kwargs):
        said["env"] = kwargs["env"]
        return subprocess.CompletedProcess(command, 0, stdout=line + "\n", stderr=said["stderr"])

    monkeypatch.setattr(portable.subprocess, "run", app)
    said["stderr"] = f"{portable.shipped_graphs.USING} (x86-64-v3: any CPU with AVX2 and FMA)\n"
    assert real_run_app("shipped", "demo", 4, tmp_path)["tokens"] == [1]
    assert all(said["env"][name] == "" for name in portable.GPU_VISIBILITY)  # the CPU's bench, on a GPU machine too
    with pytest.raises(SystemExit, match="used the shipped graph"):
        real_run_app("own", "demo", 4, tmp_path)
    said["stderr"] = f"not {portable.shipped_graphs.USING}: GPT2_MAX_SAVED_GRAPHS=0\n"
    with pytest.raises(SystemExit, match="used another"):
        real_run_app("shipped", "demo", 4, tmp_path)
    assert real_run_app("own", "demo", 4, tmp_path)["tokens"] == [1]


def test_graphs_built_apart_become_one_unit_to_compile():
    # model/graph.py's one_module (what compile_together compiles), checked
    # without compiling: three graphs traced apart, one module holding all three.
    from bench.compile_together import matmul_graphs
    from model.graph import one_module

    module = one_module(matmul_graphs(3))
    assert module.top_level_graph_names() == ["matmul0", "matmul1", "matmul2"]


def test_every_gpu_stage_names_only_options_its_program_takes(tmp_path):
    """bench/gpu.py's commands, checked here where no GPU is: every option a
    stage gives one of this project's programs is in that program's --help."""
    import re
    import sys

    from conftest import run_python

    from bench.gpu import stages

    plan = stages(sys.executable, "hf-python", tmp_path)
    helps = {}
    for commands in plan.values():
        for command in commands:
            if command[:2] != [sys.executable, "-m"] or command[2] == "pytest":
                continue
            program = command[2]
            if program not in helps:
                done = run_python("-m", program, "--help", timeout=120)
                assert done.returncode == 0, done.stderr[-2000:]
                helps[program] = set(re.findall(r"--[a-z][a-z0-9-]*", done.stdout))
            options = {part.split("=")[0] for part in command[3:] if part.startswith("--")}
            assert options <= helps[program], (program, options - helps[program])
    assert set(helps) == {"model", "bench", "bench.accuracy", "bench.serve"}
    assert {"check", "bench", "bench-plain", "bench-xl", "bench-xl-compiled", "bench-xl-plain", "bench-serve",
            "serve-capture", "serve-steps"} <= set(plan)


def test_a_gpu_stage_logs_each_line_timed_and_says_its_first_failure(tmp_path):
    import sys

    from bench.gpu import run

    plan = {"one": [[sys.executable, "-c", "print('first'); print('second')"],
                    [sys.executable, "-c", "import sys; sys.exit(3)"]],
            "two": [[sys.executable, "-c", "import sys; sys.exit(4)"]]}
    assert run(["one", "two"], plan, tmp_path / "logs") == 3
    log = (tmp_path / "logs" / "one.log").read_text()
    assert "s] first" in log and "s] second" in log and "one: exit 3 in" in log
    summary = (tmp_path / "logs" / "summary.txt").read_text().splitlines()
    assert [line.split(" in ")[0] for line in summary] == ["one: exit 0", "one: exit 3", "two: exit 4"]


def test_profile_decode_without_a_block_times_a_graph_that_passes_its_input_through(tmp_path, capsys, monkeypatch):
    """--without builds a second graph with the named blocks' outputs their inputs: the same
    tokens in, other logits out; the course's classes are whole again after it."""
    from bench import profile_decode
    from solutions.solution_03 import LayerNorm
    from solutions.solution_07 import GPT2MultiHeadAttention

    before = (LayerNorm.forward, GPT2MultiHeadAttention._attn)
    with profile_decode.left_out(["attention"]):
        assert LayerNorm.forward is before[0]
        assert GPT2MultiHeadAttention._attn(None, "q", "k", "v", "mask") == "q"
    with pytest.raises(RuntimeError), profile_decode.left_out(["layer_norm", "attention"]):
        raise RuntimeError("a build that fails")
    assert (LayerNorm.forward, GPT2MultiHeadAttention._attn) == before
    from model.graph_source import USE

    monkeypatch.setenv(USE, "0")  # main() sets it for its process: restored after this test
    folder = write_checkpoint(tmp_path / "m", SIZES, seed=5)
    argv = ["--model", str(folder), "--steps", "2", "--rounds", "1", "--without", "layer_norm", "attention"]
    assert profile_decode.main(argv) == 0
    out = capsys.readouterr().out
    assert "whole step" in out and "without layer_norm and attention" in out and "of the step" in out
    assert (LayerNorm.forward, GPT2MultiHeadAttention._attn) == before
    from model.gpt2 import BuildOptions, load_gpt2

    ids = np.array([[1, 2, 3]])
    whole = load_gpt2(folder, BuildOptions(device="cpu"), with_tokenizer=False)
    with profile_decode.left_out(["layer_norm", "attention"]):  # the graph main() built: held, not compiled again
        without = load_gpt2(folder, BuildOptions(device="cpu"), with_tokenizer=False)
    assert not np.allclose(whole.forward_logits(ids), without.forward_logits(ids))
