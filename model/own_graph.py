"""``python -m model.own_graph OPTIONS CHECKPOINT``: the background compile of this CPU's own graph.

Started by model/graph_source.py's ``compile_own_in_background`` where a
shipped graph runs another kernel path than this CPU's own: compiled and
saved while it holds the lock (one at a time), and the run that first loads
it is told so in one line.
"""

from __future__ import annotations

import json
import sys

from filelock import FileLock, Timeout

from model import caches, cpu, saved_graphs
from model.gpt2 import load_gpt2, opened
from model.graph_source import OWN_LOCK
from model.options import BuildOptions


def compile_own(options_json: str, checkpoint: str) -> int:
    try:
        with FileLock(caches.folder("graphs") / OWN_LOCK, timeout=0):
            options = BuildOptions(**json.loads(options_json))
            gpt2 = load_gpt2(checkpoint, options, with_tokenizer=False)
            if gpt2.saved_graph:
                return 0  # another process saved it first (a run told to compile)
            _, _, graph_config = opened(checkpoint, options)
            saved_graphs.note_first_load(
                saved_graphs.graph_name(options, graph_config),
                f"using this CPU's own graph ({cpu.native_path(cpu.flags())} kernels), compiled in the background "
                f"by an earlier run in {gpt2.compile_seconds:.0f} s")
    except Timeout:  # another background compile runs
        pass
    return 0


if __name__ == "__main__":
    sys.exit(compile_own(*sys.argv[1:3]))
