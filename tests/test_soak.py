"""The server under load, for minutes: run by hand, not in CI.

    GPT2_MAX_SOAK=300 .venv/bin/python -m pytest tests/test_soak.py -s     # 64 clients for 5 minutes

64 clients on 127.0.0.1 send completions for GPT2_MAX_SOAK seconds, one after
another each. Every 8th request of a client is one the server must refuse
(bad JSON, a 1 MB prompt, 100k max_tokens) and every 8th after that a stream
it leaves after the first chunk. Held: every good request answered with its
tokens, every bad one with a 4xx, no other outcome; the server's memory (the
resident set of its processes) after the first minute within 10% of
where it ends (the launcher and every process under it); p50 / p99 latency printed. Skipped unless GPT2_MAX_SOAK is set.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

SECONDS = float(os.environ.get("GPT2_MAX_SOAK", "0"))
CLIENTS = 64
pytestmark = pytest.mark.skipif(not SECONDS, reason="a soak of minutes: GPT2_MAX_SOAK=300 to run it (docs/serving.md)")

BAD = [
    ("{not json", "bad JSON"),
    (json.dumps({"model": "demo", "prompt": "x" * (1 << 20), "max_tokens": 4}), "a 1 MB prompt"),
    (json.dumps({"model": "demo", "prompt": "Hello", "max_tokens": 100_000}), "100k max_tokens"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from test_serve import Server  # the serve tests' own: python -m serve --model demo, a free port

    srv = Server(tmp_path_factory.mktemp("soak") / "server.log")
    srv.wait_ready()
    yield srv
    srv.stop()


def tree_rss_mb(root: int) -> float:
    """The resident memory of ``root`` and every process under it, in MB
    (test_serve.process_tree: the launcher, max serve, its API process, the
    model worker and their helpers)."""
    from test_serve import process_tree

    total = 0
    for pid in process_tree(root):
        try:
            total += int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    return total / 1e6


def post(base: str, body: str, stream_first_chunk: bool = False) -> tuple[int, str]:
    request = urllib.request.Request(base + "/v1/completions", data=body.encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            if stream_first_chunk:
                return r.status, r.readline().decode()  # and leave: the connection closes
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def test_64_clients_for_minutes(server):
    base = server.base
    deadline = time.monotonic() + SECONDS
    lock = threading.Lock()
    latencies: list[float] = []
    counts = {"good": 0, "refused": 0, "left": 0}
    wrong: list[str] = []

    def client(i: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            n += 1
            if n % 8 == 0:
                body, what = BAD[(i + n) % len(BAD)]
                status, text = post(base, body)
                with lock:
                    if 400 <= status < 500:
                        counts["refused"] += 1
                    else:
                        wrong.append(f"{what}: {status} {text[:200]}")
                continue
            body = {"model": "demo", "prompt": f"And it came to pass {i} {n}", "max_tokens": 16, "temperature": 0}
            if n % 8 == 4:
                status, first = post(base, json.dumps(dict(body, stream=True)), stream_first_chunk=True)
                with lock:
                    if status == 200 and first.startswith("data:"):
                        counts["left"] += 1
                    else:
                        wrong.append(f"stream: {status} {first[:200]}")
                continue
            start = time.monotonic()
            status, text = post(base, json.dumps(body))
            seconds = time.monotonic() - start
            with lock:
                if status == 200 and json.loads(text)["usage"]["completion_tokens"] == 16:
                    counts["good"] += 1
                    latencies.append(seconds)
                else:
                    wrong.append(f"good request: {status} {text[:200]}")

    rss: list[tuple[float, float]] = []
    sampling = threading.Event()

    def sample() -> None:
        start = time.monotonic()
        while not sampling.wait(10):
            rss.append((time.monotonic() - start, tree_rss_mb(server.process.pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    sampling.set()
    sampler.join()
    assert not wrong, f"{len(wrong)} wrong answers, the first: {wrong[:3]}"
    assert counts["good"] > CLIENTS and counts["refused"] > 0 and counts["left"] > 0
    warm = [mb for t, mb in rss if t >= 60] or [mb for _, mb in rss]
    q = statistics.quantiles(latencies, n=100)
    print(f"\nsoak: {SECONDS:.0f} s, {CLIENTS} clients: {counts['good']} completions of 16 tokens, "
          f"{counts['refused']} refused as they should be, {counts['left']} streams left after one chunk; "
          f"latency p50 {q[49]:.2f} s, p99 {q[98]:.2f} s; server RSS after the first minute "
          f"{warm[0]:.0f} MB -> {warm[-1]:.0f} MB (max {max(warm):.0f})")
    assert warm[-1] <= 1.10 * warm[0], rss  # flat after warm-up: no growth per request
    # ...and it still answers.
    status, _ = post(base, json.dumps({"model": "demo", "prompt": "And", "max_tokens": 3, "temperature": 0}))
    assert status == 200
