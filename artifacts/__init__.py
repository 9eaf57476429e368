"""Compiled artifacts: a compiled thing named by what made it, shipped with the project, loaded later.

This package knows no model. An artifact is one kind of compiled thing (the
app's graph, the server's graphs, MAX's eager kernels) for one target
(``targets.py``), made by one MAX version, and described by one facts file
whose keys are the same for every kind (``facts.py``): what it is, what it
was made from, its files with their bytes and sha256, and what made it.
``facts.why_not_here`` says in words why one cannot run in this process;
``files.unpack`` puts its files in a cache folder, whole and verified;
``atomic.writing`` is the one way anything here is written (whole or not at
all); ``mef.py`` names MAX's folders of compiled graphs.

Where the shipped ones lie: ``shipped/<kind>/<name>/<level>/`` at the
repository's root (``facts.folder``). Who makes them: ``python -m maintain
make`` (maintain/). Who uses them: the app (model/graph_source.py), the
server (serve/shipped.py), the checker (checker/eager_kernels.py); each kind
differs only in how it is made and how MAX is pointed at it.
"""
