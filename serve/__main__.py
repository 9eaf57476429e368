"""Serve GPT-2 with MAX's own serving engine: an OpenAI-compatible HTTP API.

    python -m serve                          # gpt2 from the Hugging Face cache, on localhost:8000
    python -m serve --model demo             # the bundled demo, no network needed
    python -m serve --model ./my-gpt2 --port 8080 --max-batch-size 16
    python -m serve --model demo --impl steps  # serve the model built from your steps/

This runs ``max serve`` with this project's GPT-2 architecture (serve/arch.py,
registered through ``--custom-architectures``), the flags this model needs, and
the project's checks in front of the completions route (serve/engine.py,
serve/checks.py: fields the engine would ignore are refused by name, ``stop``
cuts the text before the stop string, ``seed: 0`` is a seed).
It serves ``/v1/completions`` (with streaming), ``/v1/models`` and
``/health``, and Prometheus metrics on ``/metrics`` at ``--metrics-port``
(nothing is sent outside); GPT-2 has no chat template, so ``/v1/chat/completions`` is
refused, saying so. Ctrl-C or SIGTERM stops it gracefully: no new
connections, the requests in flight finish (for up to ``--drain-timeout``
seconds), then every process of the server ends.

Anything after ``--`` goes to ``max serve`` unchanged (``max serve --help``).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from model.device import AUTO_DTYPE, DeviceError
from model.options import IMPLS, LINEARS, BuildOptions
from serve.lifeline import PARENT

ROOT = Path(__file__).resolve().parent.parent
DRAIN_SECONDS = 30.0  # in-flight requests' time to finish after SIGTERM (MAX_SERVE_GRACEFUL_SHUTDOWN_TIMEOUT_S)
LEFTOVER_SECONDS = 10.0  # after max serve exits: SIGTERM to what is left of its group, SIGKILL after this

MAX_BATCH_SIZE = 8  # sequences decoded together by default; bench.serve measures this default too
# MAX's server reads its metrics port from the environment only, 8001 unless set (max/serve/config.py).
METRICS_PORT_ENV, METRICS_PORT = "MAX_SERVE_METRICS_ENDPOINT_PORT", 8001


class StartError(Exception):
    """What stops the server before its engine starts, said in one line (exit status 2): the
    engine would fail on it only after its own start, in a traceback."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serve", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2",
                   help="Hugging Face id, a local checkpoint folder, or `demo` (the bundled model); default gpt2")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="port of the Prometheus /metrics endpoint, on --host (default: MAX's, 8001, or "
                        "$MAX_SERVE_METRICS_ENDPOINT_PORT); two servers on one machine need two")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"),
                   help="auto: a GPU when MAX sees one (not yet on macOS), else the CPU")
    p.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE,
                   help="sequences decoded together (continuous batching); the KV cache is sized for "
                        f"this many full windows (default {MAX_BATCH_SIZE}); the compiled graph takes any batch")
    p.add_argument("--max-length", type=int, default=None,
                   help="prompt + completion tokens per request (default: the model's n_positions)")
    p.add_argument("--linear", default="custom", choices=LINEARS,
                   help="float32 on the CPU: custom (default, as generate's) runs the Linear layers on this "
                        "project's Mojo op (model/layers/few_rows.py: its own tiles for few rows, MAX's matmul for "
                        "more, the bias fused in; docs/serving.md), course on step 04's nn.Linear")
    p.add_argument("--impl", default="solutions", choices=IMPLS,
                   help="which code builds the model: the reference solutions, or your own steps/ files")
    p.add_argument("--echo", action="store_true",
                   help="score every prompt token, so that requests may ask for `echo` with `logprobs` (the prompt's "
                        "log-probabilities, as evaluation harnesses such as lm-evaluation-harness do); without it such "
                        "requests are refused. The same compiled graph then computes the head at every prompt "
                        "position: prompts cost more, and nothing more is compiled")
    p.add_argument("--drain-timeout", type=float, default=DRAIN_SECONDS, metavar="SECONDS",
                   help="on SIGTERM or Ctrl-C, how long the requests in flight may take to finish before they "
                        f"are cut off (default {DRAIN_SECONDS:.0f}; MAX's own default is 5)")
    p.add_argument("--dry-run", action="store_true", help="print the max serve command and exit")
    return p


def serve_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The ``max serve`` command line and environment for ``args``."""
    from weights import read_config, resolve_model
    from weights.checkpoint import check_checkpoint, weight_files

    folder = resolve_model(args.model)
    config = read_config(folder)  # refuses, by name, what this project cannot run as HF does
    if args.max_length is not None and not 1 <= args.max_length <= config.n_positions:
        raise StartError(f"--max-length must be 1..{config.n_positions} (this model's n_positions)")
    check_checkpoint(folder, config)  # headers, names and shapes (mapped, not read): a file or tensor named
    device = args.device
    if device != "cpu":  # a GPU when MAX sees one (auto: except on macOS), or --device gpu refused (model/device.py)
        from model.device import auto_note, choose

        device = choose(device).kind
        if note := auto_note(args.device):
            print(f"serve: {note}", file=sys.stderr)
    # What the engine's process builds (serve/model_config.py reads it back):
    # --dtype auto's precision for the device (float32: model/device.py), the --impl and --linear asked for,
    # and --echo (the batching then asks the graph for every position's logits). Not
    # MAX's own --enable-echo: in MAX 26.7 it also switches the sampler to
    # every position's logits, and that sampler cannot be built with
    # penalties ("repetition_penalty tensor shape [Dim('batch')] does not
    # match logits_buffer shape [Dim('total_output_len'), ...]").
    options = BuildOptions(impl=args.impl, device=device, dtype=AUTO_DTYPE[device],
                           linear=args.linear, every_position=args.echo)
    command = [
        # `max serve` with the project's request checks in front of its
        # routes (serve/engine.py); the same flags.
        sys.executable, "-m", "serve.engine",
        "--model-path", str(folder),
        # Clients name the model as the user did: "demo", "gpt2", a folder.
        "--served-model-name", args.model,
        # Our loader reads the weights (float32, float16 or bfloat16 files);
        # naming the files stops the engine looking for ones of its encoding.
        "--weight-path", *[str(f) for f in weight_files(folder)],
        "--custom-architectures", f"{ROOT}:serve",
        "--devices", device,
        "--quantization-encoding", options.dtype,
        "--max-batch-size", str(args.max_batch_size),
        "--max-length", str(args.max_length or config.n_positions),
        "--host", args.host, "--port", str(args.port),
        # In-flight batching and penalties are the architecture's
        # required_arguments (serve/arch.py): on with plain `max serve` too.
        *args.passthrough,
    ]
    # The engine gets a local folder (resolve_model fetched a hub id already):
    # it needs no hub, and must not wait for one.
    # The engine builds the model in its own process: the options travel in
    # the environment (serve/model_config.py's served_options reads them).
    path = [str(ROOT)]
    if args.impl == "steps":
        # The learner's steps/ as this process finds it (their folder may be
        # anywhere on PYTHONPATH, or the current one): its parent goes first,
        # or the repository's own steps/ would shadow it in the engine.
        from model.course import steps_folder

        path.insert(0, str(steps_folder().parent))
    # Nothing sent outside, the local Prometheus /metrics kept: MAX's
    # MAX_SERVE_DISABLE_TELEMETRY would turn both off, while OTEL_SDK_DISABLED
    # stops every exporter to Modular's collector (and the start-up log it
    # posts) but leaves /metrics, a pull surface on --host
    # (MAX's _telemetry_disabled: model/max_internals.py).
    # (GPT2_SERVE_OPTIONS: serve/model_config.py's OPTIONS, not imported here: it imports MAX's pipelines, ~5 s)
    env = dict(os.environ, OTEL_SDK_DISABLED="true", HF_HUB_OFFLINE="1", GPT2_SERVE_OPTIONS=json.dumps(asdict(options)),
               PYTHONPATH=os.pathsep.join(filter(None, [*path, os.environ.get("PYTHONPATH")])))
    if args.metrics_port is not None:
        env[METRICS_PORT_ENV] = str(args.metrics_port)
    # uvicorn's timeout_graceful_shutdown (max/serve/api_server.py's
    # fastapi_config), also read from the environment only; whole seconds.
    env["MAX_SERVE_GRACEFUL_SHUTDOWN_TIMEOUT_S"] = str(max(0, round(args.drain_timeout)))
    return command, env


def unfinished(args: argparse.Namespace) -> str | None:
    """For ``--impl steps``: one line naming every step the model needs that
    still has a TODO (as ``python -m model --impl steps`` says), else None.
    Checked before the engine starts: it would fail minutes later, in a log."""
    if args.impl != "steps":
        return None
    from model.course import MODEL_STEPS, unfinished_message, unfinished_steps

    todo = unfinished_steps(*MODEL_STEPS)
    return unfinished_message(todo) if todo else None


def check_options(args: argparse.Namespace) -> None:
    """The numbers the engine would refuse only once started."""
    if args.max_batch_size < 1:
        raise StartError(f"--max-batch-size must be at least 1, was {args.max_batch_size}")
    if args.drain_timeout < 0:
        raise StartError(f"--drain-timeout must be 0 or more seconds, was {args.drain_timeout}")
    for flag, port in (("--port", args.port), ("--metrics-port", args.metrics_port)):
        if port is not None and not 1 <= port <= 65535:
            raise StartError(f"{flag} {port}: a port is a number from 1 to 65535")


def check_ports(args: argparse.Namespace) -> None:
    """Both ports free on --host: the engine's HTTP server would fail on a port in use only
    after the model is loaded, and a metrics endpoint on a port in use would be missing (or be
    another server's)."""
    metrics = args.metrics_port
    if metrics is None:
        try:
            metrics = int(os.environ.get(METRICS_PORT_ENV, METRICS_PORT))
        except ValueError:
            raise StartError(f"{METRICS_PORT_ENV}={os.environ[METRICS_PORT_ENV]!r} is not a port") from None
    if metrics == args.port:
        raise StartError(f"--port and the metrics port are both {args.port}: give --metrics-port another")
    for flag, port in (("--port", args.port), ("--metrics-port", metrics)):
        check_port(args.host, port, flag)


def check_port(host: str, port: int, flag: str) -> None:
    """Each address ``host`` names bound and let go, as uvicorn's server (asyncio's
    create_server) binds every one of them."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartError(f"--host {host}: {exc.strerror}") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise StartError(f"{flag} {port}: {host}:{port} is in use (another server?); "
                                     f"choose another with {flag}") from None
                raise StartError(f"cannot listen on {host}:{port} (--host, {flag}): {exc.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    passthrough: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, passthrough = argv[:at], argv[at + 1:]
    args = build_parser().parse_args(argv)
    args.passthrough = passthrough
    from weights import WeightsError

    refused = unfinished(args)
    if refused:
        print(f"serve: {refused}", file=sys.stderr)
        return 2
    if args.impl == "steps":  # whose code the engine will build, said before it starts
        from model.course import MODEL_STEPS, import_steps_quietly, whose

        built = whose(*MODEL_STEPS)
        for line in filter(None, (built.warning(), built.built("server"))):
            print(f"serve: {line}", file=sys.stderr)
        import_steps_quietly()  # said above: the engine's processes inherit that their notes are said
    try:
        check_options(args)
        command, env = serve_command(args)
        if args.dry_run:
            print(" ".join(command))
            return 0
        check_ports(args)
    except (StartError, WeightsError, DeviceError) as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    from serve.shipped import start_note

    device = command[command.index("--devices") + 1]
    print(f"serve: starting MAX's server for {args.model} on http://{args.host}:{args.port}/v1 "
          f"({start_note(device)})", flush=True)
    # MAX's processes talk over ZMQ sockets bound as files in the temporary
    # folder (max/serve/worker_interface/_zmq_queue.py), which it leaves there
    # when it stops: a folder of the launcher's own, removed once the server's
    # processes are gone, keeps them out of the system's.
    with tempfile.TemporaryDirectory(prefix="gpt2-serve-", ignore_cleanup_errors=True) as scratch:
        return run_server(command, dict(env, TMPDIR=scratch))


def run_server(command: list[str], env: dict[str, str]) -> int:
    """``max serve`` run to its end, Ctrl-C and SIGTERM forwarded to it; then
    what is left of its process group ended. Its exit status."""
    # Its own session and process group: a terminal's Ctrl-C reaches this
    # process only, which forwards it. Named as its parent, this process takes
    # it along if it is killed (serve/lifeline.py).
    process = subprocess.Popen(command, env={**env, PARENT: str(os.getpid())}, start_new_session=True)

    def forward(signum, _frame):
        # To `max serve`'s own process only, not its group. There uvicorn stops
        # listening, lets the requests in flight finish (--drain-timeout), then
        # MAX stops its model worker and metrics process itself. Sent to the
        # whole group, the signal also reached the model worker, which died at
        # once and took every request in flight with it (streams cut after their
        # first chunk, no [DONE]; docs/serving.md, "Past one machine").
        process.send_signal(signum)  # a no-op once it has exited

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = process.wait()
    end_group(process.pid)
    return code


def end_group(pgid: int, grace: float = LEFTOVER_SECONDS) -> None:
    """What is left of ``max serve``'s process group once it has exited (a
    worker it did not reap, if its teardown failed): SIGTERM, then SIGKILL
    after ``grace`` seconds, so the launcher never leaves a process behind."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return  # nothing left (the usual case)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        reap_children()
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap_children() -> None:
    """Wait for this process's children that have exited. A zombie still
    counts as a member of its group for ``killpg``; when the launcher runs as
    a container's PID 1, the server's orphaned processes become its children,
    and unreaped they would hold end_group for its whole grace period."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass  # no children at all


if __name__ == "__main__":
    sys.exit(main())
