"""The cache is only a cache: a damaged entry is set aside and made again, a
write is whole or not there, and a cache that cannot be written (read-only,
full) leaves the run going without saving (model/caches.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import run_python

from artifacts import atomic
from artifacts.facts import why_not_here
from checker.skeleton import ROOT
from model import caches
from model import graph_source as portable

SHIPPED_HERE = not (portable.opted_out()
                    or why_not_here(portable.shipped_facts("demo") or {"max": "", "level": "x86-64-v3"}))
needs_shipped = pytest.mark.skipif(not SHIPPED_HERE, reason="the demo's shipped graph does not run on this machine")


def demo_env(cache: Path, **more: str) -> dict[str, str]:
    return dict(os.environ, GPT2_MAX_CACHE=str(cache), **{portable.BACKGROUND: "0"}, **more)


def run_demo(env: dict[str, str]) -> subprocess.CompletedProcess:
    return run_python("-m", "model", "--model", "demo", "--temperature", "0", "--max-new-tokens", "4", "--quiet",
                      "Hello", env=env)


def notes(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("note:")]


@needs_shipped
@pytest.mark.parametrize("damage", ["mef", "facts"])
def test_a_damaged_saved_graph_is_set_aside_and_made_again(tmp_path, damage):
    """A MEF cut short, or an empty facts.json: one line, and the run goes on (the
    shipped graph unpacked anew), as do the runs after it."""
    env = demo_env(tmp_path / "cache")
    first = run_demo(env)
    assert first.returncode == 0, first.stderr
    [folder] = (tmp_path / "cache" / "graphs").glob("gpt2_*")
    if damage == "mef":
        [mef] = folder.glob("*.mef")
        mef.write_bytes(mef.read_bytes()[:100_000])
    else:
        (folder / "facts.json").write_text("")
    for _ in range(2):
        again = run_demo(env)
        assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
        assert "Traceback" not in again.stderr
    assert len(notes(run_demo(env))) == 0
    assert folder.with_name(folder.name + atomic.BROKEN).is_dir()


@needs_shipped
def test_an_unwritable_cache_runs_without_saving_and_still_uses_the_shipped_graph(tmp_path):
    (tmp_path / "file").write_text("")
    done = run_demo(demo_env(tmp_path / "file" / "cache"))  # no folder can be made under a file
    assert done.returncode == 0, done.stderr
    assert notes(done) == [line for line in done.stderr.splitlines() if "running without saving" in line]
    assert len(notes(done)) == 1 and portable.USING in done.stderr


@needs_shipped
def test_a_staging_folder_left_by_a_killed_compile_is_removed(tmp_path):
    """A process killed mid-compile leaves its staging folder; the next write in that folder removes it."""
    env = demo_env(tmp_path / "cache", **{portable.USE: "0"})
    graphs = tmp_path / "cache" / "graphs"
    child = subprocess.Popen([sys.executable, "-m", "model", "--model", "demo", "Hello"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not list(graphs.glob(atomic.STAGING + "*")) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert list(graphs.glob(atomic.STAGING + "*"))  # what the killed process was writing
    done = run_demo(demo_env(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    assert not list(graphs.glob(atomic.STAGING + "*"))


def test_a_staging_folder_is_removed_only_when_its_process_is_gone(tmp_path):
    host = atomic.socket.gethostname()
    gone = tmp_path / f"{atomic.STAGING}{2**22 + 1}@{host}.abc"  # (Linux's pid_max is at most 2**22)
    alive = tmp_path / f"{atomic.STAGING}{os.getpid()}@{host}.def"
    elsewhere = tmp_path / f"{atomic.STAGING}1@another-machine.ghi"
    for folder in (gone, alive, elsewhere):
        folder.mkdir()
    staged = atomic.staging(tmp_path)
    assert staged.is_dir() and staged.name.startswith(f"{atomic.STAGING}{os.getpid()}@")
    assert not gone.exists() and alive.exists() and elsewhere.exists()  # another machine's: after a day


def test_a_damaged_compiled_file_is_set_aside_and_made_again(tmp_path, capsys):
    """The kernel library (model/layers/custom_op.py) is made once: a copy cut short is found by its digest."""
    made = []

    def make(staged: Path) -> None:
        made.append(staged.name)
        staged.write_bytes(b"a compiled library" * 1000)

    library = tmp_path / "kernels" / "kernels_0.mojoc"
    assert caches.made_once(library, make) == library and caches.made_once(library, make) == library
    assert made == ["kernels_0.mojoc"]
    library.write_bytes(library.read_bytes()[:100])
    assert caches.made_once(library, make) == library and len(made) == 2
    assert library.read_bytes() == b"a compiled library" * 1000
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"note: a compiled file in {library} is damaged") and "set aside" in line


def test_a_full_disk_means_running_without_saving(tmp_path, monkeypatch, capsys):
    """Checked before a compile: MAX writes the compiled graph only once its compile is done."""
    from max.driver import CPU

    from model import saved_graphs

    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path))
    monkeypatch.setattr(atomic, "_said_unsaved", False)
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: SimpleNamespace(free=1 << 20))
    store = saved_graphs.store_for("gpt2_full", CPU())
    assert store.session is None and store.staging is None  # compiled in MAX's own session, not saved
    store.keep({})
    with atomic.writing(tmp_path / "graphs" / "note") as staged:
        assert staged is None
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"note: running without saving: {tmp_path / 'graphs'} cannot be written")
    assert not [p for p in (tmp_path / "graphs").iterdir()]


def test_a_damaged_graph_of_a_unit_is_set_aside_for_its_caller_to_compile(tmp_path, monkeypatch, capsys):
    """A unit's graph that is not a model's (model/together.py's Other) found damaged: None, as if never saved."""
    from model import saved_graphs
    from model.together import Other

    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path))
    folder = tmp_path / "graphs" / "graph_damaged"
    folder.mkdir(parents=True)
    (folder / saved_graphs.FACTS).write_text("{}")
    (folder / saved_graphs.MANIFEST).write_text(json.dumps({"graphs": [{"key": "graph.mef"}]}))
    (folder / "graph.mef").write_bytes(b"not a MEF")
    other = Other(module=None, input_types=[], weights={})
    other.__dict__["name"] = folder.name  # (its name is otherwise what its traced graph computes)
    assert other.saved() is None
    assert not folder.exists() and folder.with_name(folder.name + atomic.BROKEN).is_dir()
    assert "is damaged" in capsys.readouterr().err
    assert not list((tmp_path / "graphs").glob(atomic.STAGING + "*"))
