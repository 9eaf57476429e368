"""A server started in a process group of its own, waited for, and stopped: what the bench
(llama-server and ``python -m serve``), the tests and ``python -m maintain make`` do."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NotReady(RuntimeError):
    """A server exited, or did not answer, before it was ready."""


def wait_ready(base: str, process: subprocess.Popen, timeout: float, what: str) -> float:
    """Seconds until ``base``/v1/models answers (the OpenAI route both servers have)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if process.poll() is not None:
            raise NotReady(f"{what} exited ({process.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(1)
    raise NotReady(f"{what} not ready after {timeout:.0f} s")


def group_alive(process: subprocess.Popen) -> bool:
    """Whether any process of ``process``'s group (started with start_new_session) is left."""
    try:
        os.killpg(process.pid, 0)
        return True
    except ProcessLookupError:
        return False


def stop(process: subprocess.Popen) -> int | None:
    """SIGTERM to the group the bench started (llama-server; or `python -m
    serve`'s launcher, which drains the requests in flight and ends MAX's
    server, in a session of its own, within --drain-timeout + 10 s), SIGKILL
    for what is left after 60 s; its exit code."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    deadline = time.monotonic() + 30
    while group_alive(process) and time.monotonic() < deadline:
        time.sleep(0.5)
    if group_alive(process):
        os.killpg(process.pid, signal.SIGKILL)
    return process.returncode
