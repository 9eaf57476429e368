"""``python -m serve.shipped make`` / ``check``: the server's shipped graphs made, and checked against this code.

See serve/shipped/__init__.py for what is shipped and when the server uses it.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from model import cpu, portable
from serve.shipped import EXPORT, FACTS, MANIFEST, MODELS, ROOT, SHIPPED, TARGET, folder, shipped_facts

START_TIMEOUT = 1800  # a start from empty caches compiles both graphs (minutes on 2 cores)


def make(model: str, out: Path) -> int:
    """Serve ``model`` once from empty caches, every graph the engine
    compiles written out (compiled for x86-64-v3); one request answered,
    then the graphs compressed into ``out`` with MAX's manifest and the facts."""
    from model import targets
    from model.portable.__main__ import empty_caches_env, write_notice
    from serve.process import free_port, stop, wait_ready

    # The engine runs the graphs it compiles, so this CPU must run x86-64-v3's code; and its own kernel path
    # must be the target's, so that nothing compiled here can hold wider instructions than the target's.
    own = cpu.native_path(cpu.flags())
    version = portable.max_version()
    if why := portable.cannot_run(version, target=TARGET) or (own != TARGET.path and f"its own kernel path is {own}"):
        raise SystemExit(f"serve.shipped make: not on this CPU ({why}); make them on an x86-64 CPU with AVX2 and "
                         "without AVX-512 VNNI")
    checkpoint = targets.checkpoint(model)
    with tempfile.TemporaryDirectory(prefix="gpt2-serve-shipped-") as empty:
        export = Path(empty) / "export"
        env = empty_caches_env(Path(empty), **{EXPORT: str(export)},
                               MAX_SERVE_METRICS_ENDPOINT_PORT=str(free_port()))
        port, log = free_port(), Path(empty) / "server.log"
        with open(log, "wb") as logged:
            process = subprocess.Popen([sys.executable, "-m", "serve", "--model", str(checkpoint), "--device", "cpu",
                                        "--port", str(port)], cwd=ROOT, env=env, stdout=logged,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        try:
            seconds = wait_ready(f"http://127.0.0.1:{port}", process, START_TIMEOUT, "the server")
            text = one_completion(port, str(checkpoint))
        except Exception:
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            stop(process)
        manifest = json.loads((export / MANIFEST).read_text())
        entries = {entry["key"]: entry["fingerprint"] for entry in manifest["graphs"]}
        before = shipped_facts(model) if out == folder(model) else None
        kernels = portable.kernels_digest()
        # The same graphs compile to other bytes each time: files already there for the same graphs are kept,
        # so that git's history does not grow by them at each make.
        same = (before is not None and before.get("max") == version and before.get("kernels") == kernels
                and before.get("bodies") == entries and all((out / f).is_file() for f in before["files"].values()))
        if not same:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            for key in entries:
                with open(export / key, "rb") as raw, lzma.open(out / f"{key}.xz", "wb", preset=9) as packed:
                    shutil.copyfileobj(raw, packed)
            shutil.copy(export / MANIFEST, out / MANIFEST)
        facts = {"model": model, "max": version, "level": TARGET.level, "target": TARGET.descriptor,
                 "kernels": kernels, "bodies": entries, "files": {key: f"{key}.xz" for key in entries},
                 "mef_bytes": before["mef_bytes"] if same else {key: (export / key).stat().st_size for key in entries},
                 "made_by": "python -m serve.shipped make"}
        (out / FACTS).write_text(json.dumps(facts, indent=1) + "\n")
    write_notice(SHIPPED.parent, version)
    packed = sum((out / f).stat().st_size for f in facts["files"].values())
    print(f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: {len(entries)} graphs, "
          f"{sum(facts['mef_bytes'].values()) / 1e6:.2f} MB compiled for {TARGET.level}, {packed / 1e6:.2f} MB "
          f"compressed; the server was ready in {seconds:.0f} s and answered {text!r}"
          + ("; the same graphs as the files already there, which are kept" if same else ""))
    return 0


def one_completion(port: int, served: str) -> str:
    """A greedy completion of two tokens: the engine's run-time graphs compiled too, if it has any."""
    import urllib.request

    body = json.dumps({"model": served, "prompt": "And it came to pass", "max_tokens": 2, "temperature": 0})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body.encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())["choices"][0]["text"]


def served_graph_key(model: str) -> tuple[str, str]:
    """The model graph ``python -m serve`` builds for ``model`` by default,
    traced, not compiled (seconds): its artifact's name and its body's
    digest, as MAX's store records them."""
    from model import targets
    from model.max_internals import mef_store_fingerprint, mef_store_key
    from model.options import BuildOptions
    from serve.targets import served_module

    with cpu.as_shipped():  # as the make's engine, compiling for x86-64-v3, built it
        module, inputs, _ = served_module(targets.checkpoint(model), BuildOptions(device="cpu", dtype="float32"),
                                          gpu=False)
        graph = module.trace(*inputs).graph
    return mef_store_key(graph), mef_store_fingerprint(graph)


def check(model: str) -> str:
    """Why ``model``'s shipped graphs are not what ``make`` would write for this code ("" when they are)."""
    facts = shipped_facts(model)
    if facts is None:
        return "none shipped"
    stale = [what for what, ok in (("MAX's version", facts["max"] == portable.max_version()),
                                   ("the Mojo kernels", facts.get("kernels") == portable.kernels_digest()),
                                   ("the target", facts["target"] == TARGET.descriptor),
                                   ("the files", all((folder(model) / f).is_file() for f in facts["files"].values())
                                    and (folder(model) / MANIFEST).is_file()))
             if not ok]
    if stale:
        return f"stale ({', '.join(stale)})"
    key, body = served_graph_key(model)
    if facts["bodies"].get(key) != body:
        return "stale (this code builds another model graph)"
    return ""


def main(argv: list[str] | None = None) -> int:
    import serve.shipped as shipped

    p = argparse.ArgumentParser(prog="python -m serve.shipped", description=shipped.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=shipped.__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, metavar="{make,check}")
    made = sub.add_parser("make", help=f"serve {' and '.join(MODELS)} once each from empty caches (minutes each), "
                          f"compiled for {TARGET.level}; write their graphs to {SHIPPED.relative_to(ROOT)}")
    made.add_argument("--model", choices=MODELS, action="append",
                      help="only this model (again for more; default: every one); gpt2's graphs are compiled "
                           "from a random 124M checkpoint written once into the cache folder (~500 MB)")
    sub.add_parser("check", help="exit 1 when a model's shipped graphs no longer match what this code builds")
    args = p.parse_args(argv)
    if args.command == "make":
        for model in args.model or MODELS:
            if done := make(model, folder(model)):
                return done
        return 0
    failed = 0
    for model in MODELS:
        why = check(model)
        print(f"the server's graphs for {model} shipped for {TARGET.level}: "
              + (f"{why}: python -m serve.shipped make --model {model}" if why else "match this code"))
        failed |= bool(why)
    return failed


if __name__ == "__main__":
    sys.exit(main())
