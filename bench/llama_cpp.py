"""llama.cpp as the bench's second baseline: build it, convert, measure.

    python -m bench.llama_cpp setup          # build llama.cpp in the cache folder (model/caches.py; minutes)
    python -m bench                          # finds it there; or --llama-cpp BIN_DIR / GPT2_MAX_LLAMA_CPP

Where llama.cpp comes from: PyPI's ``llama-cpp-python`` sdist carries
llama.cpp's sources (``vendor/llama.cpp``, with its gguf-py writer); cmake and
ninja come from PyPI too, installed into a throwaway venv beside the build.
Built with ``-DGGML_NATIVE=ON`` (this CPU's instructions), as llama.cpp's own
instructions build it.

What it measures, on the bench's checkpoint: the model written as float32 GGUF
by ``bench/gguf_export.py``, then ``llama-quantize`` to q8_0, q4_0 and q4_0 --pure;
``llama-bench -t <cores>`` for prefill 16 and 512 tokens, decode 128 tokens,
and decode 128 tokens after 896 in the context (``-d 896``: tokens 896-1024
of the window). Figures are converted to the bench's units (ms, tokens/s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from model import caches

VERSION = "0.3.36"  # llama-cpp-python; its vendor/llama.cpp is what is built
TARGETS = ("llama-bench", "llama-quantize", "llama-completion", "llama-server")
# llama.cpp's files: f32, q8_0, q4_0 (llama-quantize's Q4_0 as it writes it by default: the
# tied token embedding / head in Q6_K, the mixture this project calls q4_0m) and q4_0-pure
# (--pure: every matrix Q4_0, the same bytes as this project's q4_0).
PRECISIONS = ("f32", "q8_0", "q4_0", "q4_0-pure")


def default_dir() -> Path:
    return caches.folder("llama.cpp")


def sources(build_dir: Path) -> Path:
    return build_dir / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


def built() -> Path | None:
    """The binaries ``setup`` built in the default place, if it did."""
    bin_dir = sources(default_dir()) / "build" / "bin"
    return bin_dir if (bin_dir / "llama-bench").is_file() else None


def setup(dest: Path) -> Path:
    """Download and build llama.cpp; returns the folder with its binaries."""
    dest.mkdir(parents=True, exist_ok=True)
    sdist = dest / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.is_file():
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              f"llama-cpp-python=={VERSION}", "-d", str(dest)])
    src = sources(dest)
    if not src.is_dir():
        with tarfile.open(sdist) as tar:
            tar.extractall(dest, filter="data")
    tools = dest / "tools"
    if not (tools / "bin" / "cmake").is_file():
        _run([sys.executable, "-m", "venv", str(tools)])
        _run([str(tools / "bin" / "pip"), "install", "-q", "cmake", "ninja"])
    env = dict(os.environ, PATH=f"{tools / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    build = src / "build"
    # Without AMX: on an Intel Xeon with AMX in a Firecracker VM, llama-bench
    # built with it segfaulted on every quantized prompt (q8_0, q4_0: -p 16; decode ran), as
    # ggml's AMX kernels ran where the VM does not grant the tile state. -march=native would
    # turn AMX on; these flags keep everything else native.
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    _run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
          f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}",
          "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_CURL=OFF"], env=env)
    _run(["cmake", "--build", str(build), "--target", *TARGETS, f"-j{os.cpu_count() or 1}"], env=env)
    return build / "bin"


def gguf_files(bin_dir: Path, folder: Path) -> dict[str, Path]:
    """The checkpoint as GGUF in every one of PRECISIONS (made once, beside the checkpoint)."""
    from bench.gguf_export import write_gguf

    out_dir = folder / "gguf"
    out_dir.mkdir(exist_ok=True)
    files = {p: out_dir / f"model-{p}.gguf" for p in PRECISIONS}
    if not files["f32"].is_file():
        gguf_py = bin_dir.parent.parent / "gguf-py"  # <llama.cpp>/build/bin -> <llama.cpp>/gguf-py
        write_gguf(folder, files["f32"], gguf_py if gguf_py.is_dir() else None)
    for p in PRECISIONS[1:]:
        if not files[p].is_file():
            kind, _, pure = p.partition("-")
            _run([str(bin_dir / "llama-quantize"), *(["--pure"] if pure else []), str(files["f32"]), str(files[p]),
                  kind.upper()], quiet=True)
    return files


def measure(bin_dir: Path, folder: Path, reps: int, new_tokens: int, threads: int | None = None,
            precisions=PRECISIONS) -> list[dict]:
    """One result per precision asked for (those the bench pairs with its own), in the bench's keys."""
    files = {p: path for p, path in gguf_files(bin_dir, folder).items() if p in precisions}
    threads = threads or os.cpu_count() or 1
    base = [str(bin_dir / "llama-bench"), "-t", str(threads), "-r", str(reps), "-o", "json"]
    results = []
    for precision, path in files.items():
        rows = _bench(base + ["-m", str(path), "-p", "16,512", "-n", str(new_tokens)])
        rows += _bench(base + ["-m", str(path), "-p", "0", "-n", str(new_tokens), "-d", "896"])
        out = {"impl": "llama.cpp", "dtype": precision, "device": "cpu", "prefill_ms": {}, "decode_tok_s": {}}
        for r in rows:
            if r["n_prompt"] and not r["n_gen"]:
                out["prefill_ms"][str(r["n_prompt"])] = 1000 * r["n_prompt"] / r["avg_ts"]
            elif r["n_gen"] and not r["n_prompt"]:
                key = "1" if not r.get("n_depth") else "long"
                out["decode_tok_s"][key] = r["avg_ts"]
        out["ttft_ms"] = out["prefill_ms"].get("16")
        results.append(out)
    return results


def _bench(cmd: list[str]) -> list[dict]:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(done.stdout)


def _run(cmd: list[str], env: dict | None = None, quiet: bool = False) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, env=env, capture_output=quiet, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd[:3])} ...")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llama_cpp", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["setup"])
    p.add_argument("--dir", type=Path, default=default_dir(), help=f"where to build (default: {default_dir()})")
    args = p.parse_args(argv)
    print(setup(args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
