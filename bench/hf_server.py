"""bench.serve's baseline where llama.cpp is no fair match (a GPU: it is built
for the CPU here) and vLLM's wheels are not at hand: Hugging Face's
`generate` in a loop, one request at a time, behind the OpenAI completions
route that bench.serve speaks (streamed, with usage) and /v1/models. Run in
an interpreter that has torch (not a dependency of this project).

    python bench/hf_server.py FOLDER --port 8100 --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import hf_sys_path  # noqa: F401  (bench/hf_sys_path.py: before transformers)
import torch
from transformers import GPT2LMHeadModel, GPT2TokenizerFast, TextIteratorStreamer


class Server(ThreadingHTTPServer):
    # The standard library listens with a backlog of 5. bench.serve's 32 clients connect at
    # once while `generate` holds the GIL, and the kernel then resets the connections that
    # overflowed the accept queue: 'Connection reset by peer' at 32 clients on an H200.
    request_queue_size = 256


def serve(folder: str, port: int, device: str, dtype: str) -> None:
    tokenizer = GPT2TokenizerFast.from_pretrained(folder)
    model = GPT2LMHeadModel.from_pretrained(folder, torch_dtype=getattr(torch, dtype)).to(device).eval()
    one_at_a_time = threading.Lock()  # `generate` in a loop: no batching across requests

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes: no length needed for a stream

        def log_message(self, *args) -> None:  # one line per request would drown the bench's log
            pass

        def send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self.send(200, {"object": "list", "data": [{"id": folder, "object": "model"}]})
            else:
                self.send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                return self.send(404, {"error": {"message": f"no route {self.path}"}})
            request = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            ids = tokenizer(request["prompt"], return_tensors="pt").input_ids.to(device)
            temperature = float(request.get("temperature", 1.0))
            sampling = (dict(do_sample=True, temperature=temperature, top_k=0) if temperature > 0
                        else dict(do_sample=False))
            streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
            with one_at_a_time:
                result = {}

                def generate() -> None:
                    with torch.inference_mode():
                        result["ids"] = model.generate(ids, attention_mask=torch.ones_like(ids), streamer=streamer,
                                                       max_new_tokens=int(request.get("max_tokens", 16)),
                                                       pad_token_id=tokenizer.eos_token_id, **sampling)

                worker = threading.Thread(target=generate)
                worker.start()
                if request.get("stream"):
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.end_headers()
                    for text in streamer:
                        if text:
                            chunk = {"choices": [{"index": 0, "text": text}]}
                            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                            self.wfile.flush()
                    worker.join()
                    usage = {"completion_tokens": int(result["ids"].shape[1] - ids.shape[1])}
                    last = {"choices": [], "usage": usage}
                    self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
                else:
                    text = "".join(streamer)
                    worker.join()
                    usage = {"completion_tokens": int(result["ids"].shape[1] - ids.shape[1])}
                    self.send(200, {"choices": [{"index": 0, "text": text}], "usage": usage})

    Server(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()
    serve(args.folder, args.port, args.device, args.dtype)


if __name__ == "__main__":
    main()
