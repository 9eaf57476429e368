"""The kinds of shipped artifact, each a module saying how it is made and when it is stale:
its ``NAMES``, its ``LEVELS``, ``make(name, target)`` and ``stale(name, target)``."""

from maintain import app_graphs, eager_kernels, server_graphs

KINDS = {"app-graph": app_graphs, "server-graphs": server_graphs, "eager-kernels": eager_kernels}
