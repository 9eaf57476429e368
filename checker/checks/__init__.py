"""One module per step: ``USES_MAX`` and ``CHECKS`` (a list of harness.Check); its title is in checker/registry.py."""
