"""GPT-2 served by MAX's own engine (``max serve``): see docs/serving.md.

``ARCHITECTURES`` is what ``max serve --custom-architectures`` imports;
``python -m serve`` starts the server with this project's choices.
"""


def __getattr__(name: str):
    # ARCHITECTURES is made when MAX's engine asks for it: importing the
    # architecture imports MAX's pipelines (~5 s), which neither the launcher
    # (``python -m serve`` imports this package first) nor the bench's
    # helpers need.
    if name == "ARCHITECTURES":
        from serve.arch import gpt2_arch

        globals()["ARCHITECTURES"] = [gpt2_arch]  # asked for again: found without this function
        return globals()["ARCHITECTURES"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
