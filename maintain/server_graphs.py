"""The server's shipped graphs: the engine's model graph and MAX's token sampler, for x86-64-v3.

Made by serving each model once from empty caches, its engine compiling for
x86-64-v3 (MAX's virtual CPU target, set by serve/shipped.py's ``prepare`` in
the engine's process) and exporting every graph it compiles; one greedy
request answered, so that graphs compiled at run time are made too. The
engine runs what it compiles, so this machine must run x86-64-v3's code: any
x86-64 CPU with AVX2 and FMA, AVX-512 ones included (the virtual target makes
the kernels take x86-64-v3's avx2 path). Checked by tracing the model graph
the server builds against the body recorded in the shipped manifest. Used by
the server: serve/shipped.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from artifacts.facts import ROOT, max_version, why_not_here
from artifacts.mef import MANIFEST, entries
from artifacts.targets import Target
from maintain import making
from maintain.targets import checkpoint
from model import cpu
from model.graph_source import kernels_digest
from serve.shipped import EXPORT, KIND, MODELS, TARGET, shipped_facts

NAMES = MODELS
LEVELS = (TARGET.name,)
START_TIMEOUT = 1800  # a start from empty caches compiles both graphs (minutes on 2 cores)


def make(model: str, target: Target) -> int:
    """Serve ``model`` once from empty caches, every graph the engine compiles written out; ship them."""
    from serve.process import free_port, stop, wait_ready

    if why := why_not_here({"max": max_version(), "level": target.name}):
        raise SystemExit(f"the server's graphs are made where {target.name}'s code runs: not here ({why})")
    source = checkpoint(model)
    kernels = kernels_digest()  # read before the engine compiles: the kernels it compiles are these
    with tempfile.TemporaryDirectory(prefix="gpt2-server-graphs-") as empty:
        export = Path(empty) / "export"
        env = making.empty_caches_env(Path(empty), **{EXPORT: str(export)},
                                      MAX_SERVE_METRICS_ENDPOINT_PORT=str(free_port()))
        port, log = free_port(), Path(empty) / "server.log"
        with open(log, "wb") as logged:
            process = subprocess.Popen([sys.executable, "-m", "serve", "--model", str(source), "--device", "cpu",
                                        "--port", str(port)], cwd=ROOT, env=env, stdout=logged,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        try:
            seconds = wait_ready(f"http://127.0.0.1:{port}", process, START_TIMEOUT, "the server")
            text = one_completion(port, str(source))
        except Exception:
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            stop(process)
        if kernels_digest() != kernels:
            raise SystemExit("the Mojo kernels changed while the engine compiled: make them again")
        graphs = entries(export)
        made_from = {"kernels": kernels, "bodies": {g["key"]: g["fingerprint"] for g in graphs}}
        made = [export / g["key"] for g in graphs]
        kept = making.ship(KIND, model, target, made_from, [*made, export / MANIFEST], making.pack_each,
                           f"python -m maintain make --kind {KIND} --name {model} --target {target.name}")
        compiled = sum(p.stat().st_size for p in made)  # (before the folder goes)
    print(f"{KIND} {model} {target.name}: {len(made)} graphs, {compiled / 1e6:.2f} MB "
          f"compiled; the server was ready in {seconds:.0f} s and answered {text!r}"
          + ("; the same graphs as the ones shipped, which are kept" if kept else ""))
    return 0


def one_completion(port: int, served: str) -> str:
    """A greedy completion of two tokens: the engine's run-time graphs compiled too, if it has any."""
    body = json.dumps({"model": served, "prompt": "And it came to pass", "max_tokens": 2, "temperature": 0})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body.encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())["choices"][0]["text"]


def served_graph_key(model: str) -> tuple[str, str]:
    """The model graph ``python -m serve`` builds for ``model`` by default, traced, not compiled
    (seconds): its artifact's name and its body's digest, as MAX's store records them."""
    from maintain.server_targets import served_module
    from model.max_internals import mef_store_fingerprint, mef_store_key
    from model.options import BuildOptions

    with cpu.as_shipped():  # as the make's engine, compiling for x86-64-v3, built it
        module, inputs, _ = served_module(checkpoint(model), BuildOptions(device="cpu", dtype="float32"), gpu=False)
        graph = module.trace(*inputs).graph
    return mef_store_key(graph), mef_store_fingerprint(graph)


def stale(model: str, target: Target) -> str:
    """Why ``model``'s shipped graphs are not what ``make`` would ship for this code ("" when they are)."""
    facts = shipped_facts(model)
    if facts is None:
        return "none shipped"
    why = [what for what, ok in (("MAX's version", facts["max"] == max_version()),
                                 ("the Mojo kernels", facts["made_from"]["kernels"] == kernels_digest()),
                                 ("the target", facts["target"] == target.cpu)) if not ok]
    if why:
        return f"stale ({', '.join(why)})"
    key, body = served_graph_key(model)
    return "" if facts["made_from"]["bodies"].get(key) == body else "stale (this code builds another model graph)"
