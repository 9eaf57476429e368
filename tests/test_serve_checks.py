"""serve/checks.py without a server: the checks in front of MAX's completions
route, driven as the ASGI server drives them, around a stand-in for the route
that records what it was sent and answers what it is told to."""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace

import pytest

pytest.importorskip("max.serve")
from serve.checks import PROMPT_SHAPE, SEED_ZERO, CompletionChecks, held_back

MODEL = "demo"
VOCAB = 50257  # GPT-2's: token ids 0..50256


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
         headers: list | None = None, method: str = "POST") -> tuple[int, dict[bytes, bytes], bytes]:
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

    scope = {"type": "http", "method": method, "path": path, "headers": headers or []}
    asyncio.run(CompletionChecks(route, MODEL, VOCAB, echo=echo, max_bytes=max_bytes)(scope, receive, send))
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


def test_other_routes_pass_through_and_post_routes_of_other_tasks_are_not_served():
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/completions"), ("POST", "/reset_prefix_cache")):
        route = Route()
        status, _, _ = call({**BASE, "n": 5}, route, path=path, method=method)
        assert status == 200 and route.got == {**BASE, "n": 5}
    for path in ("/v1/embeddings", "/v1/audio/speech", "/invocations", "/v1/load_lora_adapter", "/v1/completion"):
        route = Route()
        status, _, content = call({"model": MODEL, "input": "Hi"}, route, path=path)
        assert status == 404 and route.got is None, path
        assert f"POST {path} is not served here" in json.loads(content)["error"]["message"]


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


def test_logprobs_are_null_unless_asked_for_and_a_malformed_prompt_is_refused():
    """MAX sends empty logprobs lists when none were asked for; OpenAI's API (and so its
    clients) has null there."""
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
        assert PROMPT_SHAPE in error_of({**BASE, "prompt": prompt, "echo": True})


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
    asyncio.run(CompletionChecks(route, MODEL, VOCAB)(scope, receive, send))
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


# --- Hostile requests: refused by name, and never an engine's crash --------------------------------

DEEP = b"[" * 100_000 + b"]" * 100_000
# (body as JSON, or raw bytes; path; the words the 400 or 404 must hold). Each one answered 500
# before these checks, and ids past the vocabulary ended the model worker. tests/test_serve.py
# sends each to a running server too.
HOSTILE = [
    ({**BASE, "prompt": [50257]}, "/v1/completions", "prompt: token ids must be in [0, 50257); got [50257]"),
    ({**BASE, "prompt": [[1, 2], [2**64]]}, "/v1/completions", "token ids must be in [0, 50257)"),
    ({**BASE, "prompt": [-1]}, "/v1/completions", "prompt: token ids must be in [0, 50257); got [-1]"),
    ({**BASE, "prompt": [1e23]}, "/v1/completions", PROMPT_SHAPE),
    ({**BASE, "prompt": []}, "/v1/completions", "prompt is empty"),
    ({**BASE, "prompt": [[]]}, "/v1/completions", "prompt is empty"),
    ({**BASE, "stop": 5}, "/v1/completions", "stop must be a text or a list of texts, was 5"),
    ({**BASE, "stop_token_ids": [2**70]}, "/v1/completions", "stop_token_ids: token ids must be in [0, 50257)"),
    ({**BASE, "seed": 1.5}, "/v1/completions", "seed: Input should be a valid integer"),
    ({**BASE, "max_tokens": None, "foo": 1}, "/v1/completions", "foo is not a field of a completion request"),
    ({"prompt": "Hi"}, "/v1/completions", "model is required"),
    ({**BASE, "target_endpoint": "http://x"}, "/v1/completions", "target_endpoint is for MAX's disaggregated"),
    ({**BASE, "thinking_temperature": -1}, "/v1/completions", "thinking_temperature must be in [0.0, 2.0]"),
    ({"model": MODEL, "input": "Hi"}, "/v1/embeddings", "POST /v1/embeddings is not served here"),
    (DEEP, "/v1/completions", "nested too deeply"),
    (b'{"model": "demo", "prompt": ' + DEEP + b"}", "/v1/completions", "nested too deeply"),
    (b"{not json", "/v1/completions", "the body is not JSON: Expecting property name enclosed in double quotes"),
    (b'{"model": "demo", "prompt": "\xff\xfe"}', "/v1/completions", "not UTF-8 text (byte 0xff at offset 29)"),
    (b'{"model": "demo", "prompt": "Hi", "top_p": NaN}', "/v1/completions", "NaN is not a number JSON has"),
    (b'{"model": "demo", "prompt": "Hi", "top_p": 1e999}', "/v1/completions", "1e999 is out of a number's range"),
    (b'[{"model": "demo", "prompt": "Hi"}]', "/v1/completions", "the body must be a JSON object"),
    (b"", "/v1/completions", "the body is not JSON"),
]


def raw(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


@pytest.mark.parametrize("body, path, named", HOSTILE, ids=lambda v: v[:40] if isinstance(v, str) else None)
def test_hostile_requests_are_refused_naming_why_before_the_engine(body, path, named):
    route = Route()
    status, _, content = call(raw(body), route, path=path)
    message = json.loads(content)["error"]["message"]
    assert status in (400, 404) and route.got is None, (status, message)
    assert named in message and "\n" not in message and len(message) < 300, message


def test_a_top_k_past_the_vocabulary_is_every_token():
    """A top_k sizes the sampler's buffers: one near 2**40 ended the model worker."""
    route = Route()
    call({**BASE, "top_k": 2**40}, route)
    assert route.got["top_k"] == -1
    call({**BASE, "top_k": VOCAB}, route)
    assert route.got["top_k"] == VOCAB


# --- A seeded fuzz over the completion fields ------------------------------------------------------

GOOD_PROMPTS = ["And it came to pass", " ", "\n\n", "é" * 3, [464, 1110, 318], [50256], [0], [[464], [11, 290]],
                ["In the", "And"]]
TEXTS = ["", "\u0000", "\ud800", "x " * 300]
IDS = [0, 50256, 50257, -1, 2**31, 2**63, 2**64, 1.5, 1e23, True, None, "5"]
# Values for each field, the good with the bad. Good ones keep a completion short: the fuzz also runs
# against a server.
FIELDS = {
    "model": [MODEL, MODEL, "gpt-4", "", None, 5, ["demo"]],
    "max_tokens": [1, 2, 4, 0, -1, 10**12, 2**63, 1.5, "3", True, [], "x"],
    "temperature": [0, 0.7, 1, 2, 2.0001, -1, 1e-308, 5e-324, 1e308, "0.5", True, None, float("nan")],
    "top_p": [0, 1e-300, 0.5, 1, 1.0001, -0.1, float("inf"), None],
    "top_k": [-2, -1, 0, 1, 50, VOCAB, VOCAB + 1, 2**31, 2**40, 2**63, 2**64, 1.5],
    "min_p": [0, 0.5, 1, -0.1, 1.1, float("nan")],
    "frequency_penalty": [-2, 0, 2, 2.5, -3, 1e30],
    "presence_penalty": [-2, 0, 1.5, 3],
    "repetition_penalty": [0, 1e-300, 1, 1.2, 1e300, -1],
    "seed": [0, 1, 7, 2**63 - 1, 2**63, -1, 1.5, "7", True, None],
    "stop": ["\n", [" the", ","], "", [], 5, [5], {"a": 1}, "x" * 1000, ["x"] * 20, None, [None]],
    "stop_token_ids": [[0], [50256], [VOCAB], [-1], [2**70], "x", [1.5], []],
    "n": [1, 2, 0, -1, None],
    "best_of": [1, 3, None],
    "logprobs": [0, 1, 5, 7, 8, -1, 100, None, True],
    "echo": [True, False, None, "yes"],
    "stream": [True, False, None, 1],
    "stream_options": [{"include_usage": True}, {"x": 1}, "x", None],
    "min_tokens": [0, 1, 3, 10, 1000, -1],
    "ignore_eos": [True, False, "yes", None],
    "logit_bias": [{}, {"5": 10}, {"x": "y"}, None],
    "suffix": ["", "end", None, 3],
    "user": ["u", 5, None],
    "return_token_ids": [True, False],
    "cache_salt": ["s", "x" * 600],
    "target_endpoint": ["tcp://127.0.0.1:1", "http://x", None],
    "dkv_cache_hint": [{}, {"x": 1}, None],
    "thinking_temperature": [0.5, -1, None],
    "reasoning": [{"effort": "high"}, {"x": 1}, None],
    "foo": [1],
}


def fuzz_prompt(rng: random.Random):
    """Mostly a good prompt; else a bad or an odd one, of any shape."""
    if rng.random() < 0.7:
        return rng.choice(GOOD_PROMPTS)
    return rng.choice([
        lambda: rng.choice(TEXTS),
        lambda: rng.sample(TEXTS + GOOD_PROMPTS[:2], rng.randint(0, 3)),
        lambda: [rng.choice(IDS) if rng.random() < 0.3 else rng.randrange(VOCAB) for _ in range(rng.randint(0, 5))],
        lambda: [[rng.choice(IDS) if rng.random() < 0.2 else rng.randrange(VOCAB) for _ in range(rng.randint(0, 3))]
                 for _ in range(rng.randint(0, 3))],
        lambda: [rng.randrange(VOCAB) for _ in range(300)],  # longer than the demo's window of 256
        lambda: rng.choice([None, 5, {"text": "Hi"}, [["Hi"]], [1, "a"], [[1], "a"]]),
    ])()


def fuzz_body(rng: random.Random) -> bytes:
    """One request for /v1/completions: a good one with some fields set to any of their values
    (or dropped); now and then its bytes spoiled."""
    body = {"model": MODEL, "prompt": fuzz_prompt(rng), "max_tokens": rng.randint(1, 4)}
    for field in rng.sample(list(FIELDS), rng.randint(0, 4)):
        body[field] = rng.choice(FIELDS[field])
    if rng.random() < 0.05:
        del body[rng.choice(["model", "prompt"])]
    data = json.dumps(body).encode()
    spoil = rng.random()
    if spoil < 0.03:
        return data[:rng.randrange(len(data))]  # cut short
    if spoil < 0.06:
        at = rng.randrange(len(data))
        return data[:at] + bytes([rng.choice([0x80, 0xc3, 0xff])]) + data[at:]
    if spoil < 0.07:
        return rng.choice([b"[]", b"5", b'"x"', b"null", DEEP[:2000] + DEEP[-2000:]])
    return data


def fuzz_bodies(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    return [fuzz_body(rng) for _ in range(count)]


FUZZ_SEED = 83


def test_a_seeded_fuzz_reaches_the_engine_only_with_requests_it_can_serve():
    """Thousands of requests, each refused with a one-line 400 before the route, or handed to it as a
    request MAX's route reads, with every token id in the vocabulary, no empty prompt, and a top_k
    the sampler can size."""
    from max.serve.schemas.openai import CreateCompletionRequest

    passed = 0
    for data in fuzz_bodies(FUZZ_SEED, 3000):
        route = Route()
        status, _, content = call(data, route)
        if status != 200:
            message = json.loads(content)["error"]["message"]
            assert status == 400 and route.got is None, (data[:200], status)
            assert message and "\n" not in message and len(message) < 300, message
            continue
        passed += 1
        request = CreateCompletionRequest.model_validate(route.got)  # what the route makes of it
        prompts = [request.prompt] if isinstance(request.prompt, str) or (
            request.prompt and isinstance(request.prompt[0], int)) else request.prompt
        assert prompts, data[:200]
        for prompt in prompts:
            assert isinstance(prompt, str) or (prompt and all(0 <= t < VOCAB for t in prompt)), data[:200]
        assert all(0 <= t < VOCAB for t in request.stop_token_ids or []), data[:200]
        assert request.top_k is None or request.top_k <= VOCAB, data[:200]
        assert request.model in (MODEL, "") and request.n in (None, 1) and not request.target_endpoint, data[:200]
    assert 300 < passed < 2700, passed  # both sides of the checks were reached
