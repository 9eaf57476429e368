"""``max serve`` with this project's request checks in front of its routes.

    python -m serve.engine --model-path DIR ... (max serve's own flags)

This is what ``python -m serve`` starts, in place of the ``max serve``
command: MAX's own command-line entry (its flags, its serving stack, its
model worker, its shutdown), with one difference. The FastAPI app MAX builds
is handed to the server wrapped in serve/checks.py's ``CompletionChecks``,
which answers what MAX 26.7's completions route would ignore, hide or fail
on (``n``, ``logit_bias``, ``seed: 0``, a bad ``temperature``, ``stop``,
``echo``'s text, token ids past the vocabulary, ...). And each of its
processes, the workers too, ends when the process that started it ends
(serve/lifeline.py). No MAX code is changed: the wrapper is put where the entry builds its app
(``serve_api_and_model_worker.fastapi_app``, the one name MAX's entry calls),
and tests/test_serve_parts.py checks that this seam still exists.
"""

from __future__ import annotations

import signal
import sys

from serve.checks import CompletionChecks
from serve.lifeline import end_with_parent

if __name__ == "__mp_main__":
    # A worker the engine spawned: multiprocessing's spawn imports the main
    # module again under this name, before the worker runs anything else.
    end_with_parent(signal.SIGKILL)


def with_checks(make_app):
    """MAX's ``fastapi_app(settings, serving_settings)``, its app wrapped in
    the project's checks for the model name it serves."""

    def make(settings, serving_settings):
        # Imported here, not above: MAX starts its metrics and model workers with multiprocessing's
        # spawn, which imports this module again in each, and model_config imports MAX's pipelines
        # (seconds) that the metrics worker never uses.
        from serve.model_config import served_options

        model = serving_settings.pipeline_config.model
        served = model.model_name  # --served-model-name, else the path
        return CompletionChecks(make_app(settings, serving_settings), served, model.huggingface_config.vocab_size,
                                served_options().every_position, settings.max_request_bytes)

    return make


def main(argv: list[str]) -> None:
    end_with_parent(signal.SIGTERM)  # python -m serve's: stopped as on Ctrl-C if it is killed
    from model.max_internals import serve_entrypoints

    pipelines, entry = serve_entrypoints()
    entry.fastapi_app = with_checks(entry.fastapi_app)
    pipelines.main(["serve", *argv], prog_name="max")


if __name__ == "__main__":
    main(sys.argv[1:])
