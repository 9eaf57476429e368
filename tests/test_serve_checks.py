"""serve/checks.py without a server: the checks in front of MAX's completions
route, driven as the ASGI server drives them, around a stand-in for the route
that records what it was sent and answers what it is told to."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("max.serve")
from serve.checks import SEED_ZERO, CompletionChecks, held_back

MODEL = "demo"


class Tokenizer:
    async def decode(self, ids) -> str:
        return "".join(f"<{i}>" for i in ids)


class Route:
    """A stand-in for MAX's app: records the body it receives, then sends
    ``replies`` (ASGI messages) back. Its ``state.pipeline.tokenizer``
    decodes token ids as ``<id>``."""

    def __init__(self, replies: list[dict] | None = None) -> None:
        self.replies = replies or whole({"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]})
        self.got: dict | None = None
        self.state = SimpleNamespace(pipeline=SimpleNamespace(tokenizer=Tokenizer()))

    async def __call__(self, scope, receive, send) -> None:
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            self.got = json.loads(raw)
        except ValueError:
            self.got = raw  # what a client sent that is not JSON, as it came
        for reply in self.replies:
            await send(reply)


def whole(payload: dict) -> list[dict]:
    body = json.dumps(payload).encode()
    return [{"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]},
            {"type": "http.response.body", "body": body}]


def streamed(texts: list[str], finish: str = "stop", usage: bool = True, logprobs: list | None = None) -> list[dict]:
    """MAX's stream as sse-starlette sends it: one event a message."""
    events = [{"choices": [{"index": 0, "text": t, "logprobs": logprobs[i] if logprobs else None,
                            "finish_reason": finish if i == len(texts) - 1 else None}]} for i, t in enumerate(texts)]
    if usage:
        events.append({"choices": [], "usage": {"completion_tokens": len(texts)}})
    frames = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
    return [{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]},
            *[{"type": "http.response.body", "body": f, "more_body": True} for f in frames],
            {"type": "http.response.body", "body": b"", "more_body": False}]


def call(body, route: Route, path="/v1/completions", chunks: int = 2, echo: bool = False, max_bytes: int = 0,
         headers: list | None = None) -> tuple[int, dict[bytes, bytes], bytes]:
    """Sends ``body`` (split over ``chunks`` messages) through the checks."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    step = max(1, len(raw) // chunks)
    parts = [raw[i:i + step] for i in range(0, len(raw), step)] or [b""]
    incoming = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    sent: list[dict] = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers or []}
    asyncio.run(CompletionChecks(route, MODEL, echo=echo, max_bytes=max_bytes)(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start.get("headers", [])), b"".join(m.get("body", b"") for m in sent[1:])


def error_of(body) -> str:
    route = Route()
    status, _, content = call(body, route)
    assert status == 400, content
    assert route.got is None, "a refused request must not reach the engine"
    return json.loads(content)["error"]["message"]


BASE = {"model": MODEL, "prompt": "And it came to pass", "max_tokens": 5}


@pytest.mark.parametrize("extra, named", [
    ({"n": 2}, "n=2"),
    ({"best_of": 3}, "best_of=3"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"suffix": " the end"}, "suffix"),
    ({"stream": True, "prompt": ["one", "two"]}, "stream takes one prompt, this request has 2"),
    ({"model": "gpt-4"}, "'gpt-4' is not served here; this server serves 'demo'"),
    ({"seed": -1}, "seed must be an integer from 0"),
    ({"seed": 2**63}, "seed must be an integer from 0"),
    ({"temperature": -1}, "temperature must be in [0.0, 2.0], was -1"),
    ({"top_p": 1.5}, "top_p must be in [0.0, 1.0]"),
    ({"max_tokens": -1}, "max_tokens must be a non-negative integer, was -1"),
    ({"frequency_penalty": 3}, "frequency_penalty must be in [-2.0, 2.0]"),
])
def test_what_the_engine_would_ignore_or_hide_is_refused_by_name(extra, named):
    assert named in error_of({**BASE, **extra})


@pytest.mark.parametrize("extra", [{}, {"n": 1, "best_of": 1, "logit_bias": {}, "suffix": "", "seed": 5,
                                        "temperature": 2, "top_p": 1, "max_tokens": 3}])
def test_a_good_request_reaches_the_engine_unchanged(extra):
    route = Route()
    status, _, content = call({**BASE, **extra}, route)
    assert status == 200 and json.loads(content)["choices"][0]["text"] == "ok"
    assert route.got == {**BASE, **extra}


def test_seed_zero_is_a_seed_of_its_own():
    """MAX's route takes seed 0 as no seed (seed or randint(0, 2**63 - 1));
    sent on as 2**63, outside both that range and what clients may send."""
    route = Route()
    call({**BASE, "seed": 0}, route)
    assert route.got == {**BASE, "seed": SEED_ZERO}
    assert SEED_ZERO > 2**63 - 1


def test_chat_completions_are_refused_saying_why():
    route = Route()
    status, _, content = call({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}, route,
                              path="/v1/chat/completions")
    assert status == 400 and route.got is None
    assert "no chat template" in json.loads(content)["error"]["message"]


def test_other_paths_and_bodies_that_are_not_json_pass_through():
    for path in ("/v1/models", "/v1/embeddings"):
        route = Route()
        status, _, _ = call({**BASE, "n": 5}, route, path=path)
        assert status == 200 and route.got == {**BASE, "n": 5}
    route = Route(whole({"error": "Missing JSON."}))
    status, _, content = call(b"{not json", route)
    assert route.got == b"{not json" and json.loads(content) == {"error": "Missing JSON."}


def test_a_whole_completion_is_cut_before_the_first_stop_string():
    """The string found first in the text wins, not the first listed; the
    length header follows the new body."""
    text = "Babylon was great, and came to the end"
    route = Route(whole({"choices": [{"index": 0, "text": text, "finish_reason": "stop"},
                                     {"index": 1, "text": "no stop here", "finish_reason": "length"}]}))
    status, headers, content = call({**BASE, "stop": ["came to the", " great"]}, route)
    out = json.loads(content)
    assert int(headers[b"content-length"]) == len(content)
    first, second = out["choices"]
    assert (first["text"], first["finish_reason"]) == ("Babylon was", "stop")
    assert (second["text"], second["finish_reason"]) == ("no stop here", "length")


@pytest.mark.parametrize("texts", [
    ["And", " it", " came", " to", " Babylon", ".", " And"],  # the stop string in one chunk, a token after it
    ["And it came to Bab", "ylon. And"],  # split across chunks
    ["And it came to B", "a", "b", "ylon"],  # held back over several
])
def test_a_stream_is_cut_before_the_first_stop_string(texts):
    status, _, content = call({**BASE, "stream": True, "stop": "Babylon"}, Route(streamed(texts)))
    assert status == 200
    events = [e[len(b"data: "):] for e in content.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"] == {"completion_tokens": len(texts)}  # the usage chunk still goes out
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(c["text"] for c in choices) == "And it came to "
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["stop"]


def test_a_stream_without_its_stop_string_is_whole():
    """Text held back as a possible stop string's start goes out after all."""
    texts = ["And it came to B", "ab", "el"]
    _, _, content = call({**BASE, "stream": True, "stop": ["Babylon"]}, Route(streamed(texts, "length")))
    choices = [json.loads(e[6:])["choices"] for e in content.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert "".join(c[0]["text"] for c in choices if c) == "And it came to Babel"
    assert [c[0]["finish_reason"] for c in choices if c and c[0]["finish_reason"]] == ["length"]


def test_held_back_is_the_longest_end_that_starts_a_stop_string():
    assert held_back("came to B", ["Babylon"]) == 1
    assert held_back("came to Baby", ["Babylon", "y"]) == 4
    assert held_back("came to", ["Babylon"]) == 0
    assert held_back("x", ["xyz", "xy"]) == 1


def test_echo_is_refused_saying_how_to_get_it_where_the_server_was_started_without():
    assert "python -m serve --echo" in error_of({**BASE, "echo": True, "logprobs": 1})


def logprobs_of(n: int, first: float = -1.0) -> dict:
    return {"token_logprobs": [first - i for i in range(n)], "top_logprobs": [{"x": first - i} for i in range(n)]}


def test_echo_puts_each_prompt_before_its_choice_and_a_null_first_logprob():
    """MAX returns the completion's text alone, and for a prompt of n tokens
    n log-probabilities (each prompt token after the first, then the first
    completion token's): OpenAI's echo has the prompt's text first and a
    null for the prompt's first token. Token-id prompts are decoded."""
    choices = [{"index": 0, "text": " done", "logprobs": logprobs_of(4), "finish_reason": "length"},
               {"index": 1, "text": " too", "logprobs": logprobs_of(3), "finish_reason": "length"}]
    route = Route(whole({"choices": choices}))
    _, headers, content = call({**BASE, "prompt": [[5, 6, 7, 8], [9, 10, 11]], "echo": True, "logprobs": 1,
                                "max_tokens": 1}, route, echo=True)
    first, second = json.loads(content)["choices"]
    assert int(headers[b"content-length"]) == len(content)
    assert first["text"] == "<5><6><7><8> done" and second["text"] == "<9><10><11> too"
    assert first["logprobs"]["token_logprobs"] == [None, -1.0, -2.0, -3.0, -4.0]
    assert first["logprobs"]["top_logprobs"][:2] == [None, {"x": -1.0}]
    assert len(second["logprobs"]["token_logprobs"]) == 3 + 1
    route = Route()
    _, _, content = call({**BASE, "echo": True}, route, echo=True)  # a text prompt, no logprobs
    assert json.loads(content)["choices"][0]["text"] == "And it came to passok"


def test_echo_streamed_and_cut_at_a_stop_string():
    """The prompt goes before the first chunk only; the stop cut acts on
    the completion, not on the echoed prompt (which holds "came")."""
    route = Route(streamed([" and", " came", " back"], "stop", logprobs=[logprobs_of(5), logprobs_of(1, -9.0),
                                                                        logprobs_of(1, -8.0)]))
    _, _, content = call({**BASE, "stream": True, "echo": True, "logprobs": 1, "stop": " came"}, route, echo=True)
    chunks = [json.loads(e[6:]) for e in content.split(b"\n\n") if e and e != b"data: [DONE]"]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(c["text"] for c in choices) == "And it came to pass and"
    assert choices[0]["logprobs"]["token_logprobs"][:2] == [None, -1.0]
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["stop"]


def test_logprobs_are_null_unless_asked_for_and_a_malformed_prompt_is_left_to_the_route():
    """MAX sends empty logprobs lists when none were asked for; OpenAI's API (and so its
    clients) has null there. A prompt that cannot be echoed reaches the route, which refuses it."""
    empty = {"token_logprobs": [], "top_logprobs": [], "tokens": [], "text_offset": []}
    for extra, echo in (({"echo": True}, True), ({}, False)):
        route = Route(whole({"choices": [{"index": 0, "text": " x", "finish_reason": "length", "logprobs": empty}]}))
        _, _, content = call({**BASE, **extra}, route, echo=echo)
        assert json.loads(content)["choices"][0]["logprobs"] is None
    route = Route(streamed([" a", " b"], logprobs=[empty, empty]))
    _, _, content = call({**BASE, "stream": True}, route)
    events = [json.loads(e[6:]) for e in content.decode().split("\n\n") if e.startswith("data: {")]
    assert [c["logprobs"] for e in events for c in e["choices"]] == [None, None]
    asked = logprobs_of(1)
    route = Route(whole({"choices": [{"index": 0, "text": " x", "finish_reason": "length", "logprobs": asked}]}))
    _, _, content = call({**BASE, "logprobs": 1}, route)
    assert json.loads(content)["choices"][0]["logprobs"] == asked
    for prompt in (5, {"a": 1}):
        route = Route()
        status, _, _ = call({**BASE, "prompt": prompt, "echo": True}, route, echo=True)
        assert status == 200 and route.got["prompt"] == prompt  # the stand-in answers what MAX would refuse


def test_a_body_past_max_s_size_limit_is_handed_on_unread_for_max_to_refuse():
    """MAX's own size limit sits inside these checks: past it the body is not
    buffered here, but handed on as it comes (MAX then answers 413)."""
    big = {**BASE, "prompt": "x" * 5000, "n": 3}  # n=3 would be refused here if it were read
    route = Route()
    status, _, _ = call(big, route, chunks=10, max_bytes=1000)
    assert status == 200 and route.got == big
    route = Route()
    status, _, _ = call(big, route, max_bytes=1000, headers=[(b"content-length", str(len(json.dumps(big))).encode())])
    assert status == 200 and route.got == big


def test_values_that_are_not_numbers_are_left_to_the_route():
    """A string the route's schema may coerce ("5") is not this layer's to refuse."""
    route = Route()
    status, _, _ = call({**BASE, "max_tokens": "5", "seed": 5.0}, route)
    assert status == 200 and route.got["max_tokens"] == "5"


# --- vLLM's tokenizer routes (what lm-evaluation-harness's remote tokenizer asks) ------------------

class Delegate:
    """A stand-in for the served Hugging Face tokenizer: one token per character."""
    eos_token = bos_token = "<|endoftext|>"
    pad_token = None

    def __len__(self) -> int:
        return 300

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def tokenizer_call(path: str, body=None, method: str = "POST") -> tuple[int, dict]:
    route = Route()
    route.state.pipeline.tokenizer = SimpleNamespace(delegate=Delegate(), max_length=256)
    raw = b"" if body is None else json.dumps(body).encode()
    incoming = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict] = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": []}
    asyncio.run(CompletionChecks(route, MODEL)(scope, receive, send))
    assert route.got is None, "a tokenizer route must not reach the engine"
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def test_the_tokenizer_routes_answer_as_vllm_s_do():
    status, info = tokenizer_call("/tokenizer_info", method="GET")
    assert status == 200 and info["eos_token"] == "<|endoftext|>" and info["model_max_length"] == 256
    long = "x" * 300  # longer than the window: a document a rolling window will cut, counted whole
    status, out = tokenizer_call("/tokenize", {"model": MODEL, "prompt": long, "add_special_tokens": False})
    assert status == 200 and out["tokens"] == [120] * 300 and out["count"] == 300 and out["max_model_len"] == 256
    status, out = tokenizer_call("/detokenize", {"tokens": [72, 105]})
    assert (status, out) == (200, {"prompt": "Hi"})
    for path, body, named in [("/tokenize", {"messages": []}, "takes a text as `prompt`"),
                              ("/tokenize", {"prompt": "a", "model": "gpt-4"}, "'gpt-4' is not served here"),
                              ("/detokenize", {"tokens": [1, 999]}, "token ids must be in [0, 300); got [999]"),
                              ("/detokenize", {"tokens": "Hi"}, "a list of token ids")]:
        status, out = tokenizer_call(path, body)
        assert status == 400 and named in out["error"]["message"], out
