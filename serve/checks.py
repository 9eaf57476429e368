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
* hands the engine token ids past the vocabulary (the model worker dies on
  them, and the whole server with it) and a ``top_k`` of any size (one near
  2**40 does the same); fails with a 500 on a negative id, an empty prompt, a
  body nested too deeply, and answers malformed JSON with "Missing JSON.";
* reads NaN and Infinity, which JSON has not (a NaN ``top_p`` passes its range
  checks), and a refusal of its schema's is a dozen lines;
* has other POST routes (embeddings, speech, SageMaker's, ...) that hand the
  engine requests of tasks GPT-2 has not;
* stops at a ``stop`` string but returns the text with it (and at times the
  token after it), where OpenAI returns the text before it;
* returns an ``echo`` request's completion without the prompt before it;
* sends empty log-probability lists where none were asked for (OpenAI: null);
* has no tokenizer routes (vLLM's, which evaluation clients ask first).

``CompletionChecks`` is an ASGI middleware around MAX's app (serve/engine.py
puts it there): it reads the request body, refuses what the engine would
ignore, hide or fail on with a 400 naming the field (in one line; MAX's route
is handed only bodies it reads as a request GPT-2 can serve), answers the
POST routes of other tasks with a 404, rewrites ``seed: 0`` into a seed of
its own and a ``top_k`` past the vocabulary into every token, cuts each
choice's text at the first stop string, streamed or not, with ``echo`` puts
the prompt before it, sets ``logprobs`` to null where none were asked for,
and answers vLLM's tokenizer routes itself
(serve/tokenizer_routes.py). Every other request and response passes through
unchanged.
"""

from __future__ import annotations

import json
import math
from typing import Any

from model.max_internals import openai_error_body
from serve import tokenizer_routes

PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
# POST routes of MAX's app handed on as they come: they reach no model. Its
# other POST routes (embeddings, speech, LoRA adapters, SageMaker's, ...)
# would hand the engine requests of tasks GPT-2 has not, and are answered 404.
PASSED_ON = ("/reset_prefix_cache",)
NOT_SERVED = ("POST {path} is not served here: this server serves GPT-2's completions, POST " + PATH +
              " (and vLLM's POST /tokenize and /detokenize)")
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
                   "repetition_penalty": "repetition_penalty", "thinking_temperature": "thinking_temperature",
                   "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


class Refused(Exception):
    """A request this server answers with 400 and this message."""


EMPTY_PROMPT = "prompt is empty: GPT-2 continues text, so send at least one token of it"
PROMPT_SHAPE = "prompt must be a text, a list of texts, a list of token ids, or a list of lists of token ids"


def parse_body(raw: bytes) -> dict:
    """The request's JSON object, or Refused saying what is wrong with the body.

    JSON as RFC 8259 has it: UTF-8, and no NaN or Infinity (Python's json reads
    them, and a NaN ``top_p`` passes the engine's range checks)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(f"the body is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    try:
        body = json.loads(text, parse_constant=not_a_number, parse_float=finite)
    except RecursionError:
        raise Refused("the body is JSON nested too deeply to be a request") from None
    except ValueError as exc:  # not JSON; a number out of range
        raise Refused(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Refused(f"the body must be a JSON object (a request), was {shown(body)}")
    return body


def not_a_number(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON has")


def finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a number's range")
    return value


def shown(value: Any, limit: int = 60) -> str:
    """``value`` as the client wrote it, cut to ``limit`` characters: error messages stay one short line."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_token_ids(field: str, ids: list[int], vocab: int) -> None:
    """Ids past the embedding table end the model worker (an out-of-range
    gather); negative ones fail in the detokenizer."""
    wrong = [t for t in ids if not 0 <= t < vocab]
    if wrong:
        raise Refused(f"{field}: token ids must be in [0, {vocab}); got {wrong[:5]}")


def check_prompt(prompt: Any, vocab: int) -> None:
    """A text, texts, token ids, or lists of token ids, none of them empty;
    checked here rather than by the route's schema, whose refusal lists a
    failure for each of the four shapes."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt)):
        return  # texts: an empty one is the tokenizer's to refuse (serve/tokenizer.py)
    if not isinstance(prompt, list):
        raise Refused(f"{PROMPT_SHAPE}, was {shown(prompt)}")
    if not prompt:
        raise Refused(EMPTY_PROMPT)
    for ids in [prompt] if all(map(is_token_id, prompt)) else prompt:
        if not isinstance(ids, list) or not all(map(is_token_id, ids)):
            raise Refused(f"{PROMPT_SHAPE}, was {shown(prompt)}")
        if not ids:
            raise Refused(EMPTY_PROMPT)
        check_token_ids("prompt", ids, vocab)


def validated(body: dict):
    """``body`` as MAX's route reads it (its own request schema), or Refused
    naming the first field that schema refuses, in one line."""
    from max.serve.schemas.openai import CreateCompletionRequest
    from pydantic import ValidationError

    try:
        return CreateCompletionRequest.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
    field = ".".join(map(str, error["loc"]))
    if error["type"] == "missing":
        raise Refused(f"{field} is required")
    if error["type"] == "extra_forbidden":
        raise Refused(f"{field} is not a field of a completion request")
    raise Refused(f"{field}: {error['msg']}, was {shown(error['input'])}")


def check_request(body: dict, served: str, vocab: int) -> dict:
    """The body to hand MAX's route, or Refused naming what is wrong.

    ``served`` is the model name clients use (``--served-model-name``);
    ``vocab`` the model's vocabulary size (its token ids are 0..vocab-1)."""
    if "prompt" in body:
        check_prompt(body["prompt"], vocab)
    stop = body.get("stop")
    if not (stop is None or isinstance(stop, str) or
            (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise Refused(f"stop must be a text or a list of texts, was {shown(stop)}")
    request = validated(body)
    for field in ("n", "best_of"):
        if getattr(request, field) not in (None, 1):
            raise Refused(f"{field}={body[field]!r} is not supported by this server: it returns one completion per "
                          "prompt; send the request again (with another seed) for another sample")
    if request.logit_bias:
        raise Refused("logit_bias is not supported by this server (the engine would ignore it)")
    if request.suffix:
        raise Refused("suffix is not supported: GPT-2 continues text, it does not fill in between a prompt "
                      "and a suffix")
    for field in ("target_endpoint", "dkv_cache_hint"):
        if getattr(request, field):
            raise Refused(f"{field} is for MAX's disaggregated serving, which this server does not run")
    prompt = body.get("prompt")
    if request.stream and isinstance(prompt, list) and len(prompt) > 1 and not is_token_id(prompt[0]):
        raise Refused(f"stream takes one prompt, this request has {len(prompt)}: stream each on its own, "
                      "or send them together without stream")
    if request.model and request.model != served:
        raise Refused(f"model {request.model!r} is not served here; this server serves {served!r}")
    check_token_ids("stop_token_ids", request.stop_token_ids or [], vocab)
    if request.seed is not None:
        if not 0 <= request.seed <= SEED_LIMIT:
            raise Refused(f"seed must be an integer from 0 to {SEED_LIMIT}, was {request.seed!r}")
        if request.seed == 0:
            body = {**body, "seed": SEED_ZERO}
    check_sampling(request)
    if request.top_k is not None and request.top_k > vocab:
        # Every token, as top_k -1 asks; a larger top_k sizes the sampler's
        # buffers by it, and one near 2**40 ends the model worker.
        body = {**body, "top_k": -1}
    return body


def check_sampling(request) -> None:
    """The engine's own checks of the sampling settings (SamplingParams, the
    ones its route runs), with their reasons passed on instead of hidden."""
    from max.pipelines.context.sampling_params import (
        SamplingParams,
        SamplingParamsGenerationConfigDefaults,
        SamplingParamsInput,
    )

    given = {name: getattr(request, field) for name, field in SAMPLING_FIELDS.items()
             if getattr(request, field) is not None}
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
    put before each choice's text. ``served``: the model's name; ``vocab``:
    its vocabulary size (token ids are 0..vocab-1); ``echo``:
    whether the network was built to score prompts (``python -m serve
    --echo``); ``max_bytes``: MAX's request size limit (its own middleware,
    inside this one, answers 413 past it: a body that large is handed on
    unread)."""

    def __init__(self, app, served: str, vocab: int, echo: bool = False, max_bytes: int = 0) -> None:
        self.app = app
        self.served = served
        self.vocab = vocab
        self.echo = echo
        self.max_bytes = max_bytes

    def __getattr__(self, name: str):
        return getattr(self.app, name)  # app.state, app.routes, ... for whoever holds the app

    async def __call__(self, scope, receive, send) -> None:
        route = (scope.get("method"), scope.get("path"))
        if scope["type"] == "http" and route in tokenizer_routes.ROUTES:
            return await self.tokenizer_route(scope, receive, send)
        if scope["type"] != "http" or route[0] != "POST" or route[1] in PASSED_ON:
            return await self.app(scope, receive, send)
        if route[1] == CHAT_PATH:  # MAX would answer "Value error."
            return await refuse(send, NO_CHAT)
        if route[1] != PATH:
            return await respond(send, 404, openai_error_body(404, NOT_SERVED.format(path=route[1])))
        if self.too_large(declared_length(scope)):
            return await self.app(scope, receive, send)
        parts, messages, size = [], [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return await self.app(scope, replaying(messages, receive), send)  # a disconnect: handed on
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if self.too_large(size):
                return await self.app(scope, replaying(messages, receive), send)
            if not message.get("more_body"):
                break
        try:
            body = parse_body(b"".join(parts))
            checked = check_request(body, self.served, self.vocab)
            if checked.get("echo") and not self.echo:
                raise Refused(NO_ECHO)
        except Refused as exc:
            return await refuse(send, str(exc))
        if checked is not body:
            messages = [{"type": "http.request", "body": json.dumps(checked).encode(), "more_body": False}]
        echoed = await self.prompt_texts(checked) if checked.get("echo") else None
        edits = Edits(stop_strings(checked), echoed, logprobs=checked.get("logprobs") is not None)
        await self.app(scope, replaying(messages, receive), ResponseEditor(send, edits))

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
            body = parse_body(raw) if raw else {}
            payload = tokenizer_routes.answer(scope["method"], scope["path"], body,
                                              self.app.state.pipeline.tokenizer, self.served)
        except (Refused, tokenizer_routes.BadRequest) as exc:
            return await refuse(send, str(exc))
        await respond(send, 200, payload)

    def too_large(self, size: int | None) -> bool:
        return bool(self.max_bytes) and size is not None and size > self.max_bytes

    async def prompt_texts(self, body: dict) -> list[str]:
        """Each prompt of the request (checked: check_prompt) as text, token
        ids decoded by the served tokenizer, in the order of the choices."""
        prompt = body["prompt"]
        if isinstance(prompt, str) or is_token_id(prompt[0]):
            prompt = [prompt]
        tokenizer = self.app.state.pipeline.tokenizer
        return [p if isinstance(p, str) else await tokenizer.decode(p) for p in prompt]


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
