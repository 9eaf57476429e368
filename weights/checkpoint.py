"""Read a GPT-2 safetensors checkpoint and map it onto GPT2LMHeadModel's names.

Hugging Face's GPT-2 keeps its attention and MLP matrices in ``Conv1D``
layers, stored ``[in, out]``; ``nn.Linear`` (and so our model) stores
``[out, in]``. The four Conv1D weights are transposed on load; they are listed
here explicitly, as nanoGPT does, rather than guessed from shapes.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from weights.errors import WeightsError

# Conv1D weights: stored [in, out] in HF checkpoints, [out, in] in nn.Linear.
TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Buffers some checkpoints carry (the causal mask, a fill value): not weights.
IGNORED = (["attn", "bias"], ["attn", "masked_bias"])

def is_buffer(name: str) -> bool:
    """A buffer some checkpoints carry beside the weights (IGNORED)."""
    return name.split(".")[-2:] in IGNORED


_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def expected_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every parameter of GPT2LMHeadModel with its shape, from the config alone."""
    E, V, P = config.n_embd, config.vocab_size, config.n_positions
    shapes = {"transformer.wte.weight": (V, E), "transformer.wpe.weight": (P, E),
              "transformer.ln_f.weight": (E,), "transformer.ln_f.bias": (E,)}
    for i in range(config.n_layer):
        h = f"transformer.h.{i}."
        shapes.update({
            h + "ln_1.weight": (E,), h + "ln_1.bias": (E,),
            h + "attn.c_attn.weight": (3 * E, E), h + "attn.c_attn.bias": (3 * E,),
            h + "attn.c_proj.weight": (E, E), h + "attn.c_proj.bias": (E,),
            h + "ln_2.weight": (E,), h + "ln_2.bias": (E,),
            h + "mlp.c_fc.weight": (4 * E, E), h + "mlp.c_fc.bias": (4 * E,),
            h + "mlp.c_proj.weight": (E, 4 * E), h + "mlp.c_proj.bias": (E,),
        })
    return shapes


def load_state(folder: Path, config, saved=None) -> dict[str, np.ndarray]:
    """The checkpoint in ``folder`` as {GPT2LMHeadModel parameter name: float32
    array}, every shape verified against ``config`` before anything is loaded;
    ``lm_head.weight`` is the ``transformer.wte.weight`` array (tied).

    ``saved``: where to keep the arrays that are not the file's own bytes
    (the transposed Conv1D matrices; float16 / bfloat16 tensors converted)
    between runs: anything with ``load(names) -> {name: array} or None`` and
    ``save(pairs)``, (name, array) pairs made one at a time as it writes them
    (the app hands model/caches.py's ``SavedArrays``).
    Later loads map them instead of making them again. Why: transposing GPT-2
    124M's four matrices per layer (340 MB) was 0.4-0.9 s of a 1.5-1.9 s start."""
    folder = Path(folder)
    return to_model_names(read_safetensors_folder(folder), config, source=str(folder), saved=saved)


def check_checkpoint(folder: Path, config) -> None:
    """Refuse, by name, a checkpoint in ``folder`` whose files are truncated
    or whose tensors are not ``config``'s GPT-2 (a name missing or extra, a
    shape that differs, an untied head); only the headers are read and the
    tensors mapped, nothing converted (the server checks this before it starts)."""
    folder = Path(folder)
    checked_names(read_safetensors_folder(folder), config, source=str(folder))


def checked_names(raw: dict[str, np.ndarray], config, source: str = "checkpoint") -> dict[str, np.ndarray]:
    """``raw`` under the model's names (HF names with or without
    ``transformer.``; Conv1D weights transposed, as views), every name and
    shape checked against ``config`` and the head checked tied to wte:
    WeightsError naming the first that is not."""
    state: dict[str, np.ndarray] = {}
    lm_head = None
    for name, array in raw.items():
        if name == "lm_head.weight":
            lm_head = array
            continue
        short = name.removeprefix("transformer.")
        if short.endswith(TRANSPOSED):
            array = array.T
        state["transformer." + short] = array
    want = expected_shapes(config)
    missing = [name for name in want if name not in state]
    if missing:
        raise WeightsError(f"{source}: no tensor {_hf_name(missing[0])} ({len(missing)} missing); "
                           "not a complete GPT-2 checkpoint")
    extra = [name for name in state if name not in want]
    if extra:
        raise WeightsError(f"{source}: unexpected tensor {_hf_name(extra[0])}; "
                           "its config.json does not describe these weights")
    for name, shape in want.items():
        if state[name].shape != shape:
            got = state[name].shape[::-1] if name.endswith(TRANSPOSED) else state[name].shape
            stored = shape[::-1] if name.endswith(TRANSPOSED) else shape
            raise WeightsError(
                f"{source}: {_hf_name(name)} has shape {list(got)} but config.json implies {list(stored)}"
            )
    wte = state["transformer.wte.weight"]
    if lm_head is not None and (lm_head.shape != wte.shape or not np.array_equal(lm_head, wte)):
        raise WeightsError(f"{source}: lm_head.weight differs from wte.weight; only GPT-2's tied head is supported")
    return state


def to_model_names(raw: dict[str, np.ndarray], config, source: str = "checkpoint",
                   saved=None) -> dict[str, np.ndarray]:
    """Map HF names (with or without ``transformer.``) onto the model's names
    (``checked_names``), as float32; the copies this needs come from
    ``saved`` when it has them (load_state)."""
    state = checked_names(raw, config, source)
    copied = [name for name, array in state.items() if not _is_float32(array)]

    def fits(kept) -> bool:
        return kept is not None and all(kept[n].shape == state[n].shape and kept[n].dtype == np.float32 for n in copied)

    kept = saved.load(copied) if saved is not None and copied else None
    if not fits(kept) and saved is not None and copied:
        # Made one at a time, written, then mapped back: the copies never sit
        # in memory all at once (at gpt2-xl they are 6 GB; mapped, a page is
        # resident only while something reads it).
        saved.save((name, _float32(state[name])) for name in copied)
        kept = saved.load(copied)
    if fits(kept):
        state.update(kept)  # the file's own views for the rest
    else:  # nothing kept (GPT2_MAX_SAVED_GRAPHS=0, or the cache cannot be written)
        state = {name: _float32(array) for name, array in state.items()}
    # The tied head (step 11): lm_head.weight is the wte table itself, one
    # array under both names, as Hugging Face's tie_weights makes it.
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def _hf_name(name: str) -> str:
    return name.removeprefix("transformer.")


def _is_float32(array: np.ndarray) -> bool:
    """Whether ``array`` is usable as it is: float32 and C-contiguous."""
    return array.dtype == np.float32 and array.flags["C_CONTIGUOUS"]


def _float32(array: np.ndarray) -> np.ndarray:
    """``array`` as contiguous float32: the file's own memory when it already
    is; else a converted copy, after which the file's pages it came from are
    let go (see release_pages)."""
    source = array
    if array.dtype == np.uint16:  # bfloat16 bits: the top half of a float32
        array = (array.astype(np.uint32) << 16).view(np.float32)
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.shares_memory(array, source):
        release_pages(source)
    return array


def release_pages(view: np.ndarray) -> None:
    """Drop the pages of a memory-mapped tensor from this process's resident
    memory once it has been copied (transposed, converted, quantized): else
    the mapping keeps them as long as any other tensor of the file is in use,
    and the process holds those weights twice. Only pages wholly inside the
    tensor are dropped; they were only read, so they come back from the file
    if ever touched again. Never on an array that may have been written (a
    copy-on-write page would lose the write). Anything not memory-mapped is
    left alone."""
    mapping = view  # views -> np.frombuffer's memoryview -> the mmap
    while mapping is not None and not isinstance(mapping, mmap.mmap):
        mapping = mapping.obj if isinstance(mapping, memoryview) else getattr(mapping, "base", None)
    if mapping is None or not hasattr(mapping, "madvise"):
        return
    begin = view.__array_interface__["data"][0] - np.frombuffer(mapping, np.uint8, 1).__array_interface__["data"][0]
    first = -(-begin // mmap.PAGESIZE) * mmap.PAGESIZE
    last = (begin + view.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        mapping.madvise(mmap.MADV_DONTNEED, first, last - first)


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of ``folder``: model.safetensors, or the shards its index names."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise WeightsError(f"{index}: not a safetensors index ({exc})") from None
        return [folder / shard for shard in sorted(set(weight_map.values()))]
    return [folder / "model.safetensors"]


def read_safetensors_folder(folder: Path) -> dict[str, np.ndarray]:
    """All tensors of ``model.safetensors`` or of the shards its index names."""
    tensors: dict[str, np.ndarray] = {}
    for path in weight_files(folder):
        tensors.update(read_safetensors(path))
    return tensors


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Zero-copy numpy views of a safetensors file (memory-mapped).

    The mapping is copy-on-write: the views are writable, as MAX's DLPack
    import needs to use an array's memory in place (it copies a read-only
    one, and a tied head would be copied twice); nothing here writes to
    them, and no write could ever reach the file.

    The format: an 8-byte little-endian header length, a JSON header mapping
    each name to its dtype, shape and byte range, then the raw data."""
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            head = f.read(8)
            if len(head) < 8:
                raise WeightsError(f"{path}: truncated (no safetensors header)")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > size - 8:
                raise WeightsError(f"{path}: truncated or not a safetensors file (header runs past the end)")
            header = json.loads(f.read(header_len))
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
    except FileNotFoundError:
        raise WeightsError(f"{path}: not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise WeightsError(f"{path}: corrupt safetensors header (not JSON)") from None
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or is_buffer(name):
            continue  # buffers are not weights, whatever their dtype (older transformers saved bool masks)
        try:
            dtype = _DTYPES[info["dtype"]]
            start, end = info["data_offsets"]
            shape = tuple(info["shape"])
        except (KeyError, TypeError, ValueError):
            raise WeightsError(f"{path}: corrupt entry for {name} (dtype {info.get('dtype')!r})") from None
        if base + end > size:
            raise WeightsError(f"{path}: truncated ({name} ends at byte {base + end}, the file has {size})")
        count = int(np.prod(shape, dtype=np.int64))
        if end - start != count * np.dtype(dtype).itemsize:
            raise WeightsError(f"{path}: corrupt entry for {name} (byte range does not fit its shape)")
        tensors[name] = np.frombuffer(data, dtype=dtype, count=count, offset=base + start).reshape(shape)
    return tensors
