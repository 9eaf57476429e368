"""What a build *is*: one frozen object, made by the entry point, read by the build.

    options = BuildOptions(device="cpu", dtype="q4_0")       # the CLI, the bench, the tests, the server
    gpt2 = load_gpt2("gpt2", options)                        # model/gpt2.py reads it, and nothing else

Every choice that changes the compiled graph is a field here, with its
allowed values beside it; ``--help`` texts, the saved graph's name and the
server's engine process all take them from this file. ``placement`` resolves
``device`` and ``dtype`` against the machine (model/device.py).
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field

from model.course import IMPLS  # whose blocks: the course's solutions/, or the learner's steps/
from model.device import Placement, choose

LINEARS = ("custom", "course")  # float32 on the CPU: this project's few-rows op, or step 04's nn.Linear
# auto: static on a GPU while replay is on, in_place elsewhere (BuildOptions.kv_cache); in_place: the
# app's buffers written in place; static: the same buffers, capture-safe (a GPU replays its decode
# steps); concat: step 07's concatenated tensors.
CACHES = ("auto", "in_place", "static", "concat")
REPLAY_ENV = "GPT2_MAX_REPLAY"  # 0: no capture and replay of decode steps on a GPU (as --no-replay)


def replay_default() -> bool:
    """Whether decode steps are replayed on a GPU unless said otherwise: yes, but where
    ``GPT2_MAX_REPLAY=0``."""
    return os.environ.get(REPLAY_ENV, "1") != "0"


@dataclass(frozen=True)
class BuildOptions:
    """One GPT-2 build. ``impl``: whose blocks build the model. ``device`` /
    ``dtype``: see model/device.py (q8_0 / q6_k / q4_0 / q4_0m quantize the Linear
    layers). ``linear``: for float32 on the CPU, ``custom`` runs the Linear
    layers on model/layers/few_rows.py's op (decoding ~1.2x faster), ``course``
    on step 04's nn.Linear (elsewhere it changes nothing). ``cache``:
    ``in_place`` (model/kv_cache.py's InPlaceCache), ``static`` (its
    StaticCache: the same buffers, capture-safe) or ``concat`` (step 07's
    ConcatCache, kept beside them to prove all give the same tokens);
    ``auto`` is static on a GPU while ``replay`` is on, else in_place
    (``kv_cache`` resolves it). ``replay``: on a GPU with the static cache,
    each batch size's first decode step is captured as a device graph and
    every later one replayed from it (model/runtime.py); False
    (``--no-replay``, ``GPT2_MAX_REPLAY=0``) runs every step as a plain
    call, and ``auto`` then takes the in-place cache. ``attention_layer``: also
    return that layer's attention probabilities (the attention map).
    ``every_position``: the server scores every token, not only each
    sequence's last (``python -m serve --echo``: the prompt's
    log-probabilities); the same compiled graph, asked for more rows
    (serve/model.py's GPT2BatchProcessor)."""

    impl: str = "solutions"
    device: str = "auto"
    dtype: str = "auto"
    linear: str = "custom"
    cache: str = "auto"
    attention_layer: int | None = None
    every_position: bool = False
    replay: bool = field(default_factory=replay_default)

    def __post_init__(self) -> None:
        for name, allowed in (("impl", IMPLS), ("linear", LINEARS), ("cache", CACHES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, not {getattr(self, name)!r}")
        if self.attention_layer is not None and self.attention_layer < 0:
            raise ValueError(f"attention_layer must be >= 0, not {self.attention_layer}")

    @functools.cached_property
    def placement(self) -> Placement:
        """``device`` and ``dtype`` made concrete on this machine (DeviceError if they cannot be)."""
        return choose(self.device, self.dtype)

    @property
    def kv_cache(self) -> str:
        """The cache the graph is built for: ``cache``, with ``auto`` resolved
        (static on a GPU while replay is on and no attention map is asked for)."""
        if self.cache != "auto":
            return self.cache
        static = self.placement.kind == "gpu" and self.replay and self.attention_layer is None
        return "static" if static else "in_place"

    @property
    def replays(self) -> bool:
        """Whether decode steps are captured once and replayed: on a GPU (MAX
        captures device graphs there only), with the static cache, replay on."""
        return self.replay and self.placement.kind == "gpu" and self.kv_cache == "static"

    @property
    def uses_kernels(self) -> bool:
        """Whether the graph calls model/kernels' custom ops: Q8_0 and Q4_0
        always (their only kernels), float32 on the CPU with ``linear="custom"``."""
        p = self.placement
        return (p.dtype in ("q8_0", "q4_0", "q4_0m")
                or (p.kind == "cpu" and p.dtype == "float32" and self.linear == "custom"))

    def graph_facts(self) -> dict:
        """What of these options shapes the compiled graph beyond the placement
        (model/saved_graphs.py names the saved graph by it)."""
        # every_position: read by the server's batching only, never by a graph; replay: by the runtime.
        return {key: value for key, value in asdict(self).items()
                if key not in ("impl", "device", "dtype", "every_position", "replay")} | {
            "cache": self.kv_cache, "kernels": self.uses_kernels}
