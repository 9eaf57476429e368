"""``python -m model``: generate text with GPT-2 on MAX (``pixi run generate``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from model.device import BFLOAT16_FAULT, DEVICES, DTYPES, DeviceError, auto_note
from model.options import LINEARS, REPLAY_ENV
from model.sampling import Sampling
from tasks import task_command  # the command as the learner runs tasks (pixi or tasks.py)

ROOT = Path(__file__).resolve().parent.parent
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # as a program that SIGPIPE ends: the reader of its output (`| head`) went away

EXAMPLES = """examples:
  python -m model "Hello, I'm a language model,"
  python -m model --model gpt2-medium --temperature 0 "The capital of France is"
  python -m model --prompt "Once upon a time" --prompt "In the beginning" --seed 1
  python -m model --prompt-file prompts.txt --json --max-new-tokens 40
  python -m model --impl steps --model demo "Hello"   # run the model built from your steps/ (offline)

Files come from the Hugging Face cache (HF_HOME); set HF_HUB_OFFLINE=1 to use only it.
Exit status: 0 done, 2 bad input (one line on stderr), 130 interrupted (Ctrl-C),
141 the output's reader went away (| head)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model", description="Generate text with GPT-2, compiled into a MAX graph.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="text to continue (several: a batch)")
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt; repeat for a batch")
    p.add_argument("--prompt-file", type=Path, metavar="FILE", help="read prompts from FILE, one per line")
    p.add_argument("--model", default="gpt2", metavar="ID_OR_DIR",
                   help="Hugging Face id (gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2, ...) "
                        "or a folder with config.json, model.safetensors and tokenizer files (default: gpt2)")
    p.add_argument("--max-new-tokens", type=int, default=100, metavar="N", help="tokens to add (default: 100)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="0 is greedy; lower is safer, higher is wilder (default: 0.8, as nanoGPT)")
    p.add_argument("--top-k", type=int, default=200, metavar="K",
                   help="sample among the K most likely tokens (default: 200, as nanoGPT)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="nucleus sampling: the smallest set of tokens holding probability P (default: 1, off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="> 1 makes tokens already in the text less likely (default: 1, off)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop a prompt's text at TEXT (repeatable); <|endoftext|> always stops")
    p.add_argument("--seed", type=int, default=None, help="random seed, for reproducible samples")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto takes a GPU when MAX sees one (the CPU on macOS, where no Apple GPU has run the graph "
                        "yet; default: auto)")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto: float32 (CPU and GPU); bfloat16 is GPU-only, and refused there under a MAX release "
                        f"known to compute it wrong (MAX 26.7: {BFLOAT16_FAULT}; docs/gpu.md); "
                        "q6_k / q4_0: 6- or 4-bit weights on the CPU, ~3x faster decoding, text close to but not "
                        "equal to float32's; "
                        "q8_0: 8-bit weights on this project's kernel, greedy text equal to float32's on trained "
                        "models; q4_0m: q4_0 with the head in q6_k, as llama.cpp's Q4_0 files (default: auto)")
    p.add_argument("--linear", default="custom", choices=LINEARS,
                   help="float32 on the CPU: custom = this project's Mojo kernel for few rows "
                        "(model/layers/few_rows.py: decoding ~1.2x faster than MAX's matmul); course = step 04's "
                        "nn.Linear (MAX's matmul) (default: custom)")
    p.add_argument("--no-replay", dest="replay", action="store_false",
                   help="on a GPU: run every decode step as a plain graph call over the in-place cache, not "
                        "replayed from a device graph captured at the first step (as "
                        f"{REPLAY_ENV}=0; docs/gpu.md)")
    p.add_argument("--impl", default="solutions", choices=("solutions", "steps"),
                   help="which code builds the model: the reference solutions, or your own steps/ files")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--quiet", action="store_true", help="print only the generated text")
    output.add_argument("--json", action="store_true", help="print one JSON object per prompt, nothing else")
    return p


class UsageError(Exception):
    pass


def read_prompts(args, options: tuple[str, ...] = ()) -> list[str]:
    # After `--`, argparse reads everything as a prompt: `generate -- --model demo "Hello"`
    # would try the default model with the prompt "--model". Said at once, by name.
    misread = [p for p in args.prompts if p.split("=")[0] in options]
    if misread:
        raise UsageError(f"{misread[0]!r} was read as a prompt (it came after `--`); pass options before the "
                         f"prompt without `--`, e.g. {misread[0]} ... \"Hello\"")
    prompts = list(args.prompts) + list(args.prompt)
    for prompt in prompts:
        utf8(prompt, "a prompt")
    if args.prompt_file is not None:
        try:
            text = args.prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--prompt-file {args.prompt_file}: cannot read it ({exc.__class__.__name__}: "
                             f"{getattr(exc, 'strerror', None) or exc})") from None
        prompts += [line for line in text.splitlines() if line.strip()]
        if not prompts:
            raise UsageError(f"--prompt-file {args.prompt_file}: no prompts in it (one per line)")
    if not prompts:
        raise UsageError("no prompt: pass PROMPT, --prompt TEXT or --prompt-file FILE")
    if any(not p.strip() for p in prompts):
        raise UsageError("a prompt is empty")
    return prompts


def utf8(text: str, what: str) -> None:
    """UsageError for text from the command line that is not UTF-8 (Python keeps
    each byte it cannot decode as a lone surrogate, U+DC80-U+DCFF)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        bad = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise UsageError(f"{what} is not UTF-8 text ({bad} at character {exc.start}); pass it in UTF-8") from None


def sampling_from(args) -> Sampling:
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.repetition_penalty, tuple(args.stop))
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    for stop in args.stop:
        utf8(stop, "a --stop string")
    try:
        sampling.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return sampling


def unfinished_step(exc: BaseException) -> str | None:
    """For --impl steps: the learner's step file an exception came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve().parent.name == "steps"]
    if not frames:
        return None
    frame = frames[-1]
    step = Path(frame.filename).stem.removeprefix("step_")
    todo = isinstance(exc, NotImplementedError) and "TODO" in str(exc)
    what = "is still a TODO" if todo else f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return (f"steps/step_{step}.py is not finished (line {frame.lineno}, in {frame.name}, {what}); "
            f"check it with `{task_command('s' + step)}`")


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except BrokenPipeError:
        # Whatever is still buffered goes nowhere, so that Python's exit does not fail on it too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:  # before generation, which stops cleanly on its own
        return interrupted()


_said_interrupted = threading.Lock()


def interrupted() -> int:
    """Say once that Ctrl-C ended the run; its exit status."""
    if _said_interrupted.acquire(blocking=False):
        print("\ninterrupted", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


@contextlib.contextmanager
def interrupt_ends_at_once():
    """Ctrl-C ends the process at once in this block, even inside MAX's compile:
    native code that Python's own handler waits for (minutes). The signal's
    number reaches a pipe the moment it comes (``signal.set_wakeup_fd``); a
    thread reading it exits. What the compile was writing is a staging folder,
    removed by a later run (model/caches.py)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def watch() -> None:
        while data := os.read(read, 64):
            if signal.SIGINT in data:
                os._exit(interrupted())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write)  # (the watcher reads the end of the pipe and returns)
        watcher.join()
        os.close(read)


def run(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    err = sys.stderr
    try:
        prompts = read_prompts(args, tuple(o for a in p._actions for o in a.option_strings))
        sampling = sampling_from(args)
    except UsageError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_USAGE

    from model.course import MODEL_STEPS
    from model.generate import ContextError, NotANumberError, encode_prompts, generate
    from model.gpt2 import BuildOptions, load_gpt2
    from weights import WeightsError, open_checkpoint

    whose = None
    if args.impl == "steps":
        from model.course import import_steps_quietly, unfinished_message, unfinished_steps
        from model.course import whose as whose_code

        unfinished = unfinished_steps(*MODEL_STEPS)
        if unfinished:  # all of them at once, before the model is even looked up
            print(f"error: {unfinished_message(unfinished)}", file=err)
            return EXIT_USAGE
        whose = whose_code(*MODEL_STEPS)
        if warning := whose.warning():  # a copied or failing step, said before minutes of compiling
            print(f"note: {warning}", file=err, flush=True)
            import_steps_quietly()
    start = time.perf_counter()
    try:
        # Prompts are checked before the model is built: a usage error costs
        # a second, not a compile. The build reads the same checkpoint.
        checkpoint = open_checkpoint(args.model)  # step 01's GPT2Config; imports no MAX
        encode_prompts(checkpoint.tokenizer, prompts, checkpoint.config)
    except (WeightsError, ContextError) as exc:
        print(f"error: {exc}", file=err)
        return EXIT_USAGE
    if (note := auto_note(args.device)) and not (args.quiet or args.json):
        print(f"[{note}]", file=err)
    try:
        options = BuildOptions(impl=args.impl, device=args.device, dtype=args.dtype, linear=args.linear,
                               **({} if args.replay else {"replay": False}))  # else GPT2_MAX_REPLAY's
        with interrupt_ends_at_once():
            gpt2 = load_gpt2(checkpoint, options)
    except (WeightsError, DeviceError) as exc:
        print(f"error: {exc}", file=err)
        return EXIT_USAGE
    except Exception as exc:
        message = unfinished_step(exc) if args.impl == "steps" else None
        if message is None:
            raise
        print(f"error: {message}", file=err)
        return EXIT_USAGE
    if not (args.quiet or args.json):
        quantized = f" ({gpt2.quantized_layers} layers quantized)" if gpt2.placement.quantization else ""
        print(f"[{args.model} ({args.impl}) on {gpt2.placement.kind}, {gpt2.placement.dtype}{quantized}: loaded in "
              f"{time.perf_counter() - start:.1f} s, of which "
              f"{'loading the saved graph' if gpt2.saved_graph else 'compile'} "
              f"{gpt2.compile_seconds:.1f} s]", file=err)
        if whose is not None:
            print(f"[{whose.built('app')}; the generation loop and the sampler are the app's (model/generate.py: "
                  "a KV cache and batching around step 12's rules), not your step 12]", file=err)

    stream = len(prompts) == 1 and not args.json
    if stream and not args.quiet:
        print(prompts[0], end="", flush=True)

    def on_text(index: int, text: str) -> None:
        print(text, end="", flush=True)

    try:
        results = generate(gpt2, prompts, args.max_new_tokens, sampling, args.seed, on_text if stream else None)
    except (ContextError, NotANumberError) as exc:
        print(f"error: {exc}", file=err)
        return EXIT_USAGE
    interrupted = any(r.stop_reason == "interrupted" for r in results)
    if stream:
        print()
    for i, r in enumerate(results):
        if args.json:
            print(json.dumps({
                "prompt": r.prompt, "text": r.text, "tokens": r.tokens, "stop_reason": r.stop_reason,
                "prompt_tokens": len(r.prompt_tokens), "new_tokens": len(r.tokens),
                "prefill_ms": round(r.prefill_seconds * 1000, 2),
                "decode_tokens_per_s": round(r.decode_tokens_per_second, 2),
                "compile_s": round(gpt2.compile_seconds, 2)}))
        elif not stream:
            if not args.quiet:
                print(f"--- prompt {i + 1} ---")
                print(r.prompt + r.text)
            else:
                print(r.text)
    if not (args.quiet or args.json):
        for r in results:
            note = {"context": f" (stopped: the context window of {gpt2.config.n_positions} tokens is full)",
                    "interrupted": " (interrupted)"}.get(r.stop_reason, "")
            print(f"[{len(r.tokens)} new tokens | "
                  f"prefill {len(r.prompt_tokens)} token{'s' * (len(r.prompt_tokens) != 1)} in "
                  f"{r.prefill_seconds * 1000:.1f} ms | decode {r.decode_tokens_per_second:.1f} tok/s | "
                  f"compile {gpt2.compile_seconds:.1f} s | stop: {r.stop_reason}]{note}", file=err)
    return EXIT_INTERRUPTED if interrupted else 0
