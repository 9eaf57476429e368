"""MAX's folders of compiled graphs (MEF files with MAX's manifest), as the app and the server read them.

A folder written by MAX's ``MefStore`` (``InferenceSession(export_mefs=...)``)
holds one MEF per compiled graph and ``manifest.json``: each graph's artifact
name, input and output types, and a digest of its traced body. MAX reads such
a folder back in one way only, ``MefStore.for_import``, which finds a graph's
artifact from the graph itself, traced: its key and body digest are computed
from a ``max.graph.Graph``. So there are two ways in, one per caller:

- the server's engine traces and compiles its graphs itself: the folders go
  to it as a store of MAX's, the only hook MAX's pipeline offers
  (serve/shipped.py: ``MefStore.for_import`` with a key that takes a graph
  only when its recorded body is the traced one);
- the app loads a saved or shipped graph without tracing the model at all
  (that is what makes its start fast): it reads the MEF the manifest names
  (``the_mef``) and initialises it (model/saved_graphs.py's SavedGraph).
"""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST = "manifest.json"  # what MAX's MefStore writes beside the MEF files


def entries(folder: Path) -> list[dict]:
    """The graphs MAX's manifest in ``folder`` lists: key (the MEF's name), name, signature, fingerprint."""
    return json.loads((folder / MANIFEST).read_text())["graphs"]


def the_mef(folder: Path) -> Path:
    """The one graph's MEF in ``folder`` (a folder of one compiled graph)."""
    [graph] = entries(folder)
    return folder / graph["key"]
