"""vLLM's tokenizer routes, answered with the served tokenizer.

Evaluation clients ask a server for its tokenizer before falling back to one of
their own (lm-evaluation-harness's remote tokenizer: ``GET /tokenizer_info``,
then ``POST /tokenize`` and ``POST /detokenize``). MAX 26.7's server has none of
them; answered here, a client counts and cuts tokens exactly as the server does.

    GET  /tokenizer_info  -> {"tokenizer_class", "eos_token", "bos_token", "pad_token", "model_max_length"}
    POST /tokenize   {"prompt": "text", "add_special_tokens": true}
                     -> {"tokens": [...], "count": n, "max_model_len": window, "token_strs": null}
    POST /detokenize {"tokens": [...]} -> {"prompt": "text"}

``/tokenize`` counts a text of any length (a rolling window's document is longer
than the model's window): it is the tokenizer alone, not a completion request.
"""

from __future__ import annotations

from typing import Any

INFO, TOKENIZE, DETOKENIZE = "/tokenizer_info", "/tokenize", "/detokenize"
ROUTES = {("GET", INFO), ("POST", TOKENIZE), ("POST", DETOKENIZE)}


class BadRequest(ValueError):
    """A request these routes refuse (a 400 naming why)."""


def info(delegate, window: int) -> dict[str, Any]:
    """``delegate``: the served tokenizer's Hugging Face tokenizer; ``window``: the model's context length."""
    return {"tokenizer_class": type(delegate).__name__, "eos_token": delegate.eos_token,
            "bos_token": delegate.bos_token, "pad_token": delegate.pad_token, "model_max_length": window}


def tokenize(delegate, body: Any, window: int, served: str) -> dict[str, Any]:
    _check_model(body, served)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("/tokenize takes a text as `prompt` (GPT-2 has no chat template, so no `messages`)")
    special = body.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise BadRequest(f"add_special_tokens must be true or false, was {special!r}")
    tokens = list(delegate.encode(prompt, add_special_tokens=special))
    return {"tokens": tokens, "count": len(tokens), "max_model_len": window, "token_strs": None}


def detokenize(delegate, body: Any, served: str) -> dict[str, Any]:
    _check_model(body, served)
    tokens = body.get("tokens")
    vocab = len(delegate)
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BadRequest("/detokenize takes a list of token ids as `tokens`")
    wrong = [t for t in tokens if not 0 <= t < vocab]
    if wrong:
        raise BadRequest(f"token ids must be in [0, {vocab}); got {wrong[:5]}")
    return {"prompt": delegate.decode(tokens)}


def _check_model(body: Any, served: str) -> None:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served:
        raise BadRequest(f"model {model!r} is not served here; this server serves {served!r}")


def answer(method: str, path: str, body: Any, tokenizer, served: str) -> dict[str, Any]:
    """The route's JSON answer; ``tokenizer``: the engine's (serve/tokenizer.py's), whose
    ``delegate`` is the Hugging Face tokenizer it wraps and ``max_length`` the window."""
    delegate, window = tokenizer.delegate, tokenizer.max_length
    if (method, path) == ("GET", INFO):
        return info(delegate, window)
    if path == TOKENIZE:
        return tokenize(delegate, body, window, served)
    return detokenize(delegate, body, served)
