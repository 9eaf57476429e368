"""The maintainers' tools: the shipped artifacts made and checked, the targets check.

    python -m maintain make      # every kind of shipped artifact, for every target, from empty caches
    python -m maintain check     # does each still match what this code builds? exit 1 when one does not
    python -m maintain.targets   # the app's graph compiled for hardware that is not here (and .server_targets)

Nothing a user imports imports this package: the app, the server and the
checker use the artifacts through artifacts/ and their own few lines
(model/graph_source.py, serve/shipped.py, checker/eager_kernels.py). Each kind
is a module here saying how it is made and when it is stale (maintain/kinds.py);
everything else (the facts, the files, the notice) is shared (maintain/making.py).
"""
