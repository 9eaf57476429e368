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
from dataclasses import asdict, dataclass

from model.course import IMPLS  # whose blocks: the course's solutions/, or the learner's steps/
from model.device import Placement, choose

LINEARS = ("custom", "course")  # float32 on the CPU: this project's few-rows op, or step 04's nn.Linear
CACHES = ("in_place", "concat")  # the app's buffers written in place, or step 07's concatenated tensors


@dataclass(frozen=True)
class BuildOptions:
    """One GPT-2 build. ``impl``: whose blocks build the model. ``device`` /
    ``dtype``: see model/device.py (q8_0 / q6_k / q4_0 / q4_0m quantize the Linear
    layers). ``linear``: for float32 on the CPU, ``custom`` runs the Linear
    layers on model/layers/few_rows.py's op (decoding ~1.2x faster), ``course``
    on step 04's nn.Linear (elsewhere it changes nothing). ``cache``:
    ``in_place`` (model/kv_cache.py's InPlaceCache) or ``concat`` (step
    07's ConcatCache, kept beside it to prove both give the same tokens). ``attention_layer``: also
    return that layer's attention probabilities (the attention map).
    ``every_position``: the server scores every token, not only each
    sequence's last (``python -m serve --echo``: the prompt's
    log-probabilities); the same compiled graph, asked for more rows
    (serve/model.py's GPT2BatchProcessor)."""

    impl: str = "solutions"
    device: str = "auto"
    dtype: str = "auto"
    linear: str = "custom"
    cache: str = "in_place"
    attention_layer: int | None = None
    every_position: bool = False

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
    def uses_kernels(self) -> bool:
        """Whether the graph calls model/kernels' custom ops: Q8_0 and Q4_0
        always (their only kernels), float32 on the CPU with ``linear="custom"``."""
        p = self.placement
        return (p.dtype in ("q8_0", "q4_0", "q4_0m")
                or (p.kind == "cpu" and p.dtype == "float32" and self.linear == "custom"))

    def graph_facts(self) -> dict:
        """What of these options shapes the compiled graph beyond the placement
        (model/saved_graphs.py names the saved graph by it)."""
        # every_position: read by the server's batching only, never by a graph.
        return {key: value for key, value in asdict(self).items()
                if key not in ("impl", "device", "dtype", "every_position")} | {"kernels": self.uses_kernels}
