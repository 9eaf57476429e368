"""Two `python -m serve` behind HAProxy, and the drain timeout.

    GPT2_MAX_REPLICAS=1 .venv/bin/python -m pytest tests/test_serve_lifecycle.py -s   # + two replicas, one killed

Two replicas behind HAProxy (run by hand: two servers and a minute of load):
one is killed (SIGKILL, its whole process tree) under a steady load, and
every request is still answered, HAProxy retrying on the survivor what the
dead one dropped. SIGTERM under load (every stream ends whole, new
connections are refused meanwhile, every process gone within a bound) is
the last test of test_serve.py's server, which saves CI a server start.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

# The serve tests' own: python -m serve --model demo, a free port.
from test_serve import MODEL, Server, process_tree

from bench.serve import free_port

REPLICAS = bool(os.environ.get("GPT2_MAX_REPLICAS"))
CLIENTS = 16
LOAD_SECONDS = 40.0  # of steady load through HAProxy...
KILL_AT = 15.0  # ...one replica killed this far into it
NEW_TOKENS = 16


def haproxy_config(port: int, replicas: dict[str, int]) -> str:
    """HAProxy in front of ``replicas`` (name -> port), all on 127.0.0.1.

    Round robin; a replica is taken out after two failed checks of /health
    half a second apart. ``retry-on conn-failure empty-response``: a request
    whose connection is refused (a dead replica not yet marked down) or closed
    with no answer (a replica killed while working on it) is sent again, up to
    ``retries`` times, and ``option redispatch 1`` sends every retry to another
    replica. A completion has no side effect, so sending it again is safe.
    ``option http-buffer-request``: HAProxy reads the whole request before
    it sends it on, which a retry needs (without it one request in a run,
    its body read after its headers had gone out, came back 502 "SH": not
    retried; haproxy/haproxy#2751).
    Each answer names its replica in an X-Replica header; the frontend serves
    HAProxy's own statistics at /haproxy-stats (;csv: per-replica retries,
    redispatches, status)."""
    servers = "\n".join(f"    server {name} 127.0.0.1:{p} check" for name, p in replicas.items())
    return f"""\
global
    log stdout format raw local0 info

defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    timeout check 2s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response
    option http-buffer-request

frontend gpt2
    bind 127.0.0.1:{port}
    stats enable
    stats uri /haproxy-stats
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    default-server inter 500ms fall 2 rise 2
    http-response set-header X-Replica %s
{servers}
"""


def haproxy_stats(port: int) -> dict[str, dict[str, str]]:
    """HAProxy's statistics rows of the backend's servers (and BACKEND), by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/haproxy-stats;csv", timeout=5) as r:
        text = r.read().decode().lstrip("# ")
    return {row["svname"]: row for row in csv.DictReader(io.StringIO(text)) if row["pxname"] == "replicas"}


@pytest.mark.skipif(not REPLICAS, reason="two servers and HAProxy for a minute, by hand: "
                    "GPT2_MAX_REPLICAS=1 .venv/bin/python -m pytest tests/test_serve_lifecycle.py -s (docs/serving.md)")
@pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy on PATH (Debian: apt-get install haproxy)")
def test_two_replicas_behind_haproxy_one_killed_under_load(tmp_path):
    """Two demo servers behind HAProxy; 16 clients send 16-token completions
    through it, one after another each, for 40 s; 15 s in, one replica's
    whole process tree gets SIGKILL. Held: every request answered 200 with
    its 16 tokens, with no retry by the client (HAProxy's own retries only);
    both replicas answered before the kill, only the survivor after it; HAProxy
    marks the dead one DOWN. Counts and the time window are printed."""
    servers = {"a": Server(tmp_path / "a.log"), "b": Server(tmp_path / "b.log")}
    haproxy = None
    try:
        started = time.monotonic()
        for server in servers.values():  # both start at once
            server.wait_ready()
        print(f"\nreplicas a and b on 127.0.0.1:{servers['a'].port} and :{servers['b'].port}, both ready in "
              f"{time.monotonic() - started:.0f} s")
        port = free_port()
        config = tmp_path / "haproxy.cfg"
        config.write_text(haproxy_config(port, {name: s.port for name, s in servers.items()}))
        print(f"haproxy on 127.0.0.1:{port}, config {config}")
        check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=open(tmp_path / "haproxy.log", "wb"),
                                   stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                if all(haproxy_stats(port)[name]["status"] == "UP" for name in servers):
                    break
            except (OSError, KeyError):
                pass
            assert time.monotonic() < deadline and haproxy.poll() is None, "haproxy did not see both replicas UP"
            time.sleep(0.2)

        lock = threading.Lock()
        answers: list[dict] = []
        start = time.monotonic()
        deadline = start + LOAD_SECONDS

        def client(i: int) -> None:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                body = json.dumps({"model": MODEL, "prompt": f"And it came to pass {i} {n}", "max_tokens": NEW_TOKENS,
                                   "temperature": 0, "ignore_eos": True}).encode()
                sent = time.monotonic() - start
                answer = {"sent": sent, "ok": False, "replica": None, "client_retries": 0, "error": None}
                for attempt in range(3):  # a retry by the client is counted, and the test asks for none
                    answer["client_retries"] = attempt
                    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                                     headers={"content-type": "application/json"})
                    try:
                        with urllib.request.urlopen(request, timeout=120) as r:
                            out = json.loads(r.read())
                            answer["replica"] = r.headers.get("X-Replica")
                            answer["ok"] = r.status == 200 and out["usage"]["completion_tokens"] == NEW_TOKENS
                    except (OSError, ValueError, KeyError) as exc:
                        answer["error"] = repr(exc)[:300]
                    if answer["ok"]:
                        break
                answer["answered"] = time.monotonic() - start
                with lock:
                    answers.append(answer)

        down_at: list[float] = []

        def kill_one() -> None:
            time.sleep(KILL_AT)
            victim = servers["a"].process.pid
            for pid in process_tree(victim):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed = time.monotonic() - start
            down_at.append(killed)
            while time.monotonic() < deadline:  # when HAProxy's health checks mark it DOWN
                try:
                    if haproxy_stats(port)["a"]["status"].startswith("DOWN"):
                        down_at.append(time.monotonic() - start)
                        return
                except (OSError, KeyError):
                    pass
                time.sleep(0.05)

        killer = threading.Thread(target=kill_one)
        killer.start()
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(client, range(CLIENTS)))
        killer.join()
        stats = haproxy_stats(port)
    finally:
        if haproxy is not None:
            haproxy.terminate()
            haproxy.wait(10)
        for server in servers.values():
            server.stop()

    killed = down_at[0]
    marked_down = down_at[1] if len(down_at) > 1 else None
    good = [a for a in answers if a["ok"]]
    client_retries = sum(a["client_retries"] for a in answers)
    in_flight = [a for a in answers if a["sent"] < killed < a["answered"]]
    after = [a for a in answers if a["sent"] > killed]
    before = [a for a in answers if a["answered"] < killed]
    latency = statistics.median(a["answered"] - a["sent"] for a in before)
    retries = {name: (stats[name]["wretr"], stats[name]["wredis"]) for name in ("a", "b", "BACKEND")}
    by = {name: sum(a["replica"] == name for a in before) for name in ("a", "b")}
    slowest = max((a["answered"] - killed for a in in_flight), default=0.0)
    down = f"{marked_down - killed:.2f} s" if marked_down else "never"
    print(f"replicas: {len(answers)} requests in {LOAD_SECONDS:.0f} s from {CLIENTS} clients, {len(good)} answered "
          f"with {NEW_TOKENS} tokens, {client_retries} client retries; before the kill a {by['a']} / b {by['b']} "
          f"(median {latency:.2f} s); replica a killed at {killed:.1f} s with {len(in_flight)} requests in flight on "
          f"the two (answered by {sorted({a['replica'] for a in in_flight})}, the slowest {slowest:.2f} s after the "
          f"kill); HAProxy marked it DOWN {down} after the kill; after the kill {len(after)} requests, all to "
          f"{sorted({a['replica'] for a in after})}; HAProxy's retries / redispatches {retries}")
    bad = [a for a in answers if not a["ok"]]
    assert not bad, f"{len(bad)} requests without a good answer: {bad[:3]}"
    assert client_retries == 0, [a for a in answers if a["client_retries"]][:3]
    assert {a["replica"] for a in before} == {"a", "b"}, "round robin: both replicas answered before the kill"
    assert after and {a["replica"] for a in after} == {"b"}, "after the kill, only the survivor answers"
    assert marked_down is not None, "HAProxy never marked the killed replica DOWN"


def test_the_drain_timeout_reaches_max_serve():
    """``--drain-timeout`` (default 30 s; MAX's own is 5) is uvicorn's graceful
    shutdown timeout in `max serve`, which reads it from its environment only."""
    from serve.__main__ import build_parser, serve_command

    def env(*argv: str) -> dict[str, str]:
        args = build_parser().parse_args(["--model", "demo", "--device", "cpu", *argv])
        args.passthrough = []
        return serve_command(args)[1]

    assert env()["MAX_SERVE_GRACEFUL_SHUTDOWN_TIMEOUT_S"] == "30"
    assert env("--drain-timeout", "7")["MAX_SERVE_GRACEFUL_SHUTDOWN_TIMEOUT_S"] == "7"
