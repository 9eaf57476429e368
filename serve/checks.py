"""What ``/v1/completions`` owes an OpenAI client and MAX 26.7's route does not
do: checks in front of the route, and ``stop`` applied to what comes back.

MAX's completions route (``openai_create_completion`` in
max/serve/router/openai_routes.py) builds the engine's request from the body
before any model code runs, and on the way it

* drops ``n``, ``best_of``, ``logit_bias`` and ``suffix`` without a word;
* fails a streamed request of several prompts with a 500 (NotImplementedError);
* reads ``seed: 0`` as "no seed" (``seed or randint(...)``);
* answers a bad ``max_tokens``, ``temperature``, ``top_p``, ... or an unknown
  model with 400 "Value error.", the reason only in the server's log (so does
  its chat route, for a model without a chat template: GPT-2);
* stops at a ``stop`` string but returns the text with it (and at times the
  token after it), where OpenAI returns the text before it;
* returns an ``echo`` request's completion without the prompt before it;
* sends empty log-probability lists where none were asked for (OpenAI: null);
* has no tokenizer routes (vLLM's, which evaluation clients ask first).

``CompletionChecks`` is an ASGI middleware around MAX's app (serve/engine.py
puts it there): it reads the request body, refuses what the engine would
ignore or hide with a 400 naming the field, rewrites ``seed: 0`` into a seed
of its own, cuts each choice's text at the first stop string, streamed or
not, with ``echo`` puts the prompt before it, sets ``logprobs`` to null where
none were asked for, and answers vLLM's tokenizer routes itself
(serve/tokenizer_routes.py). Every other request and response passes through
unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from model.max_internals import openai_error_body
from serve import tokenizer_routes

PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
NO_CHAT = ("GPT-2 has no chat template, so this server has no chat completions: send the text to continue "
           "to /v1/completions")
# The seed ``seed: 0`` is sent on as. MAX draws a missing seed from
# [0, 2**63 - 1] and keys its sampler with seed + tokens in 64 bits, so this
# one is outside the drawn range; client seeds are held to that range, so
# none can equal it either.
SEED_ZERO = 2**63
SEED_LIMIT = 2**63 - 1
# The engine's sampling settings (SamplingParamsInput's names) by the request
# field that sets each: its own checks run on them, and their messages are
# given back in the request's names.
SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                   "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
                   "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens",
                   "min_new_tokens": "min_tokens"}


class Refused(Exception):
    """A request this server answers with 400 and this message."""


def check_request(body: Any, served: str) -> Any:
    """The body to hand MAX's route, or Refused naming what is wrong.

    ``served`` is the model name clients use (``--served-model-name``).
    Bodies that are not a JSON object are left to the route's own errors."""
    if not isinstance(body, dict):
        return body
    for field in ("n", "best_of"):
        if body.get(field) not in (None, 1):
            raise Refused(f"{field}={body[field]!r} is not supported by this server: it returns one completion per "
                          "prompt; send the request again (with another seed) for another sample")
    if body.get("logit_bias"):
        raise Refused("logit_bias is not supported by this server (the engine would ignore it)")
    if body.get("suffix"):
        raise Refused("suffix is not supported: GPT-2 continues text, it does not fill in between a prompt "
                      "and a suffix")
    prompt = body.get("prompt")
    if body.get("stream") and isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int):
        raise Refused(f"stream takes one prompt, this request has {len(prompt)}: stream each on its own, "
                      "or send them together without stream")
    model = body.get("model")
    if model and model != served:
        raise Refused(f"model {model!r} is not served here; this server serves {served!r}")
    seed = body.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):  # other types: the route's own validation
        if not 0 <= seed <= SEED_LIMIT:
            raise Refused(f"seed must be an integer from 0 to {SEED_LIMIT}, was {seed!r}")
        if seed == 0:
            body = {**body, "seed": SEED_ZERO}
    check_sampling(body)
    return body


def check_sampling(body: dict) -> None:
    """The engine's own checks of the sampling settings (SamplingParams, the
    ones its route runs), with their reasons passed on instead of hidden."""
    from max.pipelines.context.sampling_params import (
        SamplingParams,
        SamplingParamsGenerationConfigDefaults,
        SamplingParamsInput,
    )

    # Numbers only: anything else (a string the route's schema may coerce, a
    # wrong type) is left to the route's own validation, which names it.
    given = {name: body[field] for name, field in SAMPLING_FIELDS.items()
             if isinstance(body.get(field), (int, float)) and not isinstance(body.get(field), bool)}
    try:
        SamplingParams.from_input_and_generation_config(SamplingParamsInput(**given),
                                                        SamplingParamsGenerationConfigDefaults())
    except ValueError as exc:
        message = str(exc)
        for name, field in SAMPLING_FIELDS.items():
            message = message.replace(name, field)
        raise Refused(message) from None


def stop_strings(body: Any) -> list[str]:
    stop = body.get("stop") if isinstance(body, dict) else None
    if isinstance(stop, str):
        stop = [stop]
    return [s for s in stop or [] if isinstance(s, str) and s]


def first_stop(text: str, stops: list[str]) -> int:
    """Where the first of ``stops`` to occur begins in ``text``, or -1."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found, default=-1)


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` could be the start of a
    stop string: a stream must hold them until the next chunk decides."""
    return max((n for s in stops for n in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:n])),
               default=0)


def cut_whole(response: dict, stops: list[str]) -> dict:
    """A whole (not streamed) completion with each choice cut at its first stop string."""
    for choice in response.get("choices", []):
        text = choice.get("text") or ""
        at = first_stop(text, stops)
        if at >= 0:
            choice["text"] = text[:at]
            choice["finish_reason"] = "stop"
    return response


class StreamCut:
    """Cuts one streamed completion (MAX streams one choice, index 0) at its
    first stop string: text that may begin a stop string is held back until
    the next chunk shows it does not; once a stop string is found, the text
    before it goes out with ``finish_reason`` "stop" and later chunks of text
    are dropped (the usage chunk and the final ``[DONE]`` still go out)."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""  # text received and not yet sent
        self.stopped = False

    def chunk(self, payload: dict) -> dict | None:
        """The chunk to send for ``payload``, or None to send nothing."""
        choices = payload.get("choices") or []
        if not choices:
            return payload  # the usage chunk
        if self.stopped:
            return None
        choice = choices[0]
        self.pending += choice.get("text") or ""
        at = first_stop(self.pending, self.stops)
        if at >= 0:
            self.stopped = True
            out, self.pending = self.pending[:at], ""
            choice["finish_reason"] = "stop"
        elif choice.get("finish_reason"):
            out, self.pending = self.pending, ""  # the last chunk: nothing more can follow
        else:
            keep = held_back(self.pending, self.stops)
            out, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
        choice["text"] = out
        return payload


async def refuse(send, message: str) -> None:
    """A 400 in MAX's own error envelope (OpenAI's), naming why."""
    await respond(send, 400, openai_error_body(400, message))


async def respond(send, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class CompletionChecks:
    """ASGI middleware: ``check_request`` before MAX's completions route;
    the stop strings cut from what it returns, and with ``echo`` the prompt
    put before each choice's text. ``served``: the model's name; ``echo``:
    whether the network was built to score prompts (``python -m serve
    --echo``); ``max_bytes``: MAX's request size limit (its own middleware,
    inside this one, answers 413 past it: a body that large is handed on
    unread)."""

    def __init__(self, app, served: str, echo: bool = False, max_bytes: int = 0) -> None:
        self.app = app
        self.served = served
        self.echo = echo
        self.max_bytes = max_bytes

    def __getattr__(self, name: str):
        return getattr(self.app, name)  # app.state, app.routes, ... for whoever holds the app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and (scope.get("method"), scope.get("path")) in tokenizer_routes.ROUTES:
            return await self.tokenizer_route(scope, receive, send)
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in (PATH, CHAT_PATH):
            return await self.app(scope, receive, send)
        if scope["path"] == CHAT_PATH:  # MAX would answer "Value error."
            return await refuse(send, NO_CHAT)
        if self.too_large(declared_length(scope)):
            return await self.app(scope, receive, send)
        parts, messages, size = [], [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: hand it on as it came
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if self.too_large(size):
                return await self.app(scope, replaying(messages, receive), send)
            if not message.get("more_body"):
                break
        try:
            body = json.loads(b"".join(parts))
        except (ValueError, UnicodeDecodeError):
            body = None  # MAX's own "Missing JSON."
        edits = None
        if isinstance(body, dict):
            try:
                checked = check_request(body, self.served)
                if checked.get("echo") and not self.echo:
                    raise Refused(NO_ECHO)
            except Refused as exc:
                return await refuse(send, str(exc))
            if checked is not body:
                messages = [{"type": "http.request", "body": json.dumps(checked).encode(), "more_body": False}]
            stops = stop_strings(checked)
            echoed = await self.prompt_texts(checked) if checked.get("echo") else None
            edits = Edits(stops, echoed, logprobs=checked.get("logprobs") is not None)
        await self.app(scope, replaying(messages, receive), send if edits is None else ResponseEditor(send, edits))

    async def tokenizer_route(self, scope, receive, send) -> None:
        """vLLM's /tokenizer_info, /tokenize and /detokenize (serve/tokenizer_routes.py)."""
        raw = b""
        while scope["method"] == "POST":
            message = await receive()
            raw += message.get("body", b"")
            if self.too_large(len(raw)):
                return await refuse(send, f"the body is larger than this server's limit of {self.max_bytes} bytes")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        try:
            body = json.loads(raw) if raw else {}
        except (ValueError, UnicodeDecodeError):
            return await refuse(send, "the body is not JSON")
        try:
            payload = tokenizer_routes.answer(scope["method"], scope["path"], body,
                                              self.app.state.pipeline.tokenizer, self.served)
        except tokenizer_routes.BadRequest as exc:
            return await refuse(send, str(exc))
        await respond(send, 200, payload)

    def too_large(self, size: int | None) -> bool:
        return bool(self.max_bytes) and size is not None and size > self.max_bytes

    async def prompt_texts(self, body: dict) -> list[str] | None:
        """Each prompt of the request as text (token ids decoded by the
        served tokenizer), in the order of the choices; None if the prompt
        is malformed (the route answers that with a 400 of its own)."""
        prompt = body.get("prompt")
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not isinstance(prompt, list):
            return None
        tokenizer = self.app.state.pipeline.tokenizer
        try:
            return [p if isinstance(p, str) else await tokenizer.decode(p) for p in prompt]
        except Exception:  # ids that are no tokens, a prompt of the wrong shape: the route says what
            return None


def declared_length(scope) -> int | None:
    """The request's Content-Length, if it declares one number."""
    values = [v for k, v in scope.get("headers", []) if k.lower() == b"content-length"]
    return int(values[0]) if len(values) == 1 and values[0].isdigit() else None


def replaying(messages: list[dict], receive):
    """``receive`` for the app: the messages already read, then the client's own."""
    replay = iter(messages)

    async def receive_again():
        return next(replay, None) or await receive()

    return receive_again


NO_ECHO = ("echo needs every prompt position's logits, which this server was started without: start it with "
           "`python -m serve --echo` (prompts then cost more to score)")


def echo_choice(choice: dict, prompt: str) -> None:
    """OpenAI's echo: the prompt before the text, and in ``logprobs`` (where
    there are any: MAX sends empty lists when none were asked for) an empty
    entry for the prompt's first token (the engine scores each prompt token
    after the first, given the ones before it)."""
    choice["text"] = prompt + (choice.get("text") or "")
    logprobs = choice.get("logprobs")
    if logprobs and logprobs.get("token_logprobs"):
        logprobs["token_logprobs"] = [None, *logprobs["token_logprobs"]]
        logprobs["top_logprobs"] = [None, *(logprobs.get("top_logprobs") or [])]


class Edits:
    """What a response's choices need: cut at the stop strings, with echo the
    prompt texts put before them (choice i is prompt i's), and ``logprobs:
    null`` where the request asked for none, as OpenAI's API answers (MAX
    sends empty lists)."""

    def __init__(self, stops: list[str], prompts: list[str] | None, logprobs: bool = True) -> None:
        self.stops = stops
        self.prompts = prompts
        self.logprobs = logprobs
        self.stream = StreamCut(stops)
        self.echoed = False

    def whole(self, response: dict) -> dict:
        cut_whole(response, self.stops)
        for choice in response.get("choices", []) if self.prompts is not None else []:
            echo_choice(choice, self.prompts[choice.get("index", 0)])
        self.unasked(response)
        return response

    def chunk(self, payload: dict) -> dict | None:
        payload = self.stream.chunk(payload) if self.stops else payload
        if payload is not None and payload.get("choices") and self.prompts is not None and not self.echoed:
            self.echoed = True  # a stream has one prompt, and its text goes first
            echo_choice(payload["choices"][0], self.prompts[0])
        if payload is not None:
            self.unasked(payload)
        return payload

    def unasked(self, response: dict) -> None:
        for choice in response.get("choices", []) if not self.logprobs else []:
            if "logprobs" in choice:
                choice["logprobs"] = None


class ResponseEditor:
    """The ``send`` of a response that ``Edits`` changes: a whole JSON
    completion is edited once its body is complete (its length header fixed
    up); a stream's ``data:`` events one by one."""

    def __init__(self, send, edits: Edits) -> None:
        self.send = send
        self.edits: Edits | None = edits
        self.start: dict | None = None
        self.streaming = False
        self.body = b""  # a whole response's body so far / a stream's unfinished event

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers", []))
            self.streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            if message["status"] != 200:
                self.edits = None  # an error: sent as it is
            if self.streaming or self.edits is None:
                await self.send(message)
            else:
                self.start = message  # sent with the edited body
            return
        if message["type"] != "http.response.body" or self.edits is None:
            return await self.send(message)
        self.body += message.get("body", b"")
        more = message.get("more_body", False)
        if self.streaming:
            events, _, self.body = self.body.rpartition(b"\n\n")
            out = b"".join(self.event(e) for e in events.split(b"\n\n")) if events else b""
            if not more and self.body:
                out, self.body = out + self.event(self.body), b""
            return await self.send({"type": "http.response.body", "body": out, "more_body": more})
        if more:
            return
        content = self.body
        try:
            content = json.dumps(self.edits.whole(json.loads(content))).encode()
        except ValueError:
            pass
        headers = [(k, str(len(content)).encode() if k == b"content-length" else v)
                   for k, v in self.start.get("headers", [])]
        await self.send({**self.start, "headers": headers})
        await self.send({"type": "http.response.body", "body": content})

    def event(self, event: bytes) -> bytes:
        """One server-sent event as it goes out: its JSON payload edited, or
        nothing where the stop string came before it."""
        prefix = b"data: "
        if not event.startswith(prefix) or event == b"data: [DONE]":
            return event + b"\n\n"
        try:
            payload = self.edits.chunk(json.loads(event[len(prefix):]))
        except ValueError:
            return event + b"\n\n"
        return b"" if payload is None else prefix + json.dumps(payload).encode() + b"\n\n"
