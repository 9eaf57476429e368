"""One module per step: ``TITLE`` and ``CHECKS`` (a list of harness.Check)."""
