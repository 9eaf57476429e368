"""weights/: finding, reading, verifying and mapping GPT-2 checkpoints."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from checkpoints import copy_gpt2_tokenizer, random_hf_state, reference, reference_variant, write_checkpoint

from model.caches import SavedArrays, checkpoint_key
from weights import WeightsError, load_state, load_tokenizer, read_config, resolve_model
from weights.checkpoint import TRANSPOSED, read_safetensors, to_model_names

SIZES = dict(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)


def test_config_maps_onto_step_01(tmp_path):
    folder = write_checkpoint(tmp_path / "m", SIZES)
    config = read_config(folder)
    assert (config.n_layer, config.n_head, config.n_embd, config.n_positions, config.vocab_size) == (2, 4, 32, 32, 64)
    assert config.layer_norm_epsilon == 1e-5


@pytest.mark.parametrize("prefix", [True, False])
@pytest.mark.parametrize("lm_head", [True, False])
def test_prefix_and_lm_head_variants_load_the_same(tmp_path, prefix, lm_head):
    hf = random_hf_state(SIZES, seed=1)
    folder = write_checkpoint(tmp_path / "m", SIZES, hf, prefix=prefix, lm_head=lm_head, buffers=True)
    state = load_state(folder, read_config(folder))
    assert len(state) == len(hf) + 1  # and the tied head:
    assert state["lm_head.weight"] is state["transformer.wte.weight"]
    for name, array in hf.items():
        expected = array.T if name.endswith(TRANSPOSED) else array
        np.testing.assert_array_equal(state[name], expected)
        assert state[name].flags["C_CONTIGUOUS"] and state[name].dtype == np.float32


def test_sharded_checkpoint(tmp_path):
    hf = random_hf_state(SIZES, seed=2)
    folder = write_checkpoint(tmp_path / "m", SIZES, hf, shards=3)
    assert not (folder / "model.safetensors").exists()
    state = load_state(folder, read_config(folder))
    np.testing.assert_array_equal(state["transformer.h.1.mlp.c_fc.weight"], hf["transformer.h.1.mlp.c_fc.weight"].T)


def test_reader_is_zero_copy_and_never_writes_the_file(tmp_path):
    """Writable copy-on-write views (MAX uses a writable array in place and
    copies a read-only one): a write stays in this process."""
    folder = write_checkpoint(tmp_path / "m", SIZES)
    file = folder / "model.safetensors"
    before = file.read_bytes()
    wte = read_safetensors(file)["transformer.wte.weight"]
    assert not wte.flags["OWNDATA"] and wte.flags["WRITEABLE"]
    wte[:] = 7.0
    assert file.read_bytes() == before
    assert not np.any(read_safetensors(file)["transformer.wte.weight"] == 7.0)


def test_weights_are_held_once(tmp_path):
    """What load_state returns is in memory once: tensors the model uses as
    stored are the file's own pages (the tied head too, under both names),
    and a transposed tensor's source pages are let go after the copy."""
    sizes = dict(SIZES, n_embd=256)  # c_fc.weight: 256 x 1024 float32 = 1 MiB
    folder = write_checkpoint(tmp_path / "m", sizes)
    raw = read_safetensors(folder / "model.safetensors")
    source = raw["transformer.h.0.mlp.c_fc.weight"]
    assert float(source.sum()) != 0.0  # every page of it read, so resident
    assert resident_pages(source) > 200
    state = to_model_names(raw, read_config(folder))
    assert resident_pages(source) == 0
    copied = state["transformer.h.0.mlp.c_fc.weight"]
    assert copied.flags["OWNDATA"]
    np.testing.assert_array_equal(copied, source.T)  # the source reads back from the file
    wte = state["transformer.wte.weight"]
    assert state["lm_head.weight"] is wte and np.shares_memory(wte, raw["transformer.wte.weight"])


def test_copies_are_saved_once_and_mapped_after(tmp_path):
    """With a copies folder, the transposed matrices are made on the first
    load only: a later load maps the saved ones and never reads the
    checkpoint's Conv1D pages (no transposition: the start-time saving),
    gives equal arrays, writable (MAX uses them in place) without a write
    ever reaching the saved file."""
    sizes = dict(SIZES, n_embd=256)
    folder = write_checkpoint(tmp_path / "m", sizes)
    config = read_config(folder)
    saved = SavedArrays(tmp_path / "copies" / checkpoint_key(folder))
    first = to_model_names(read_safetensors(folder / "model.safetensors"), config, saved=saved)
    name = "transformer.h.0.mlp.c_fc.weight"
    assert (saved.folder / f"{name}.npy").is_file()
    assert not (saved.folder / "transformer.wte.weight.npy").exists()  # the file's own bytes are not copied
    raw = read_safetensors(folder / "model.safetensors")
    second = to_model_names(raw, config, saved=saved)
    assert resident_pages(raw["transformer.h.0.mlp.c_fc.weight"]) == 0  # the source was never read
    assert isinstance(second[name], np.memmap) and second[name].flags["WRITEABLE"]
    for key in first:
        np.testing.assert_array_equal(second[key], first[key])
    second[name][0, 0] = 7.0
    assert np.load(saved.folder / f"{name}.npy")[0, 0] != 7.0
    np.testing.assert_array_equal(load_state(folder, config, kept(folder, tmp_path / "copies"))[name], first[name])


def test_copies_follow_the_checkpoint(tmp_path):
    """A checkpoint rewritten in place (same path and size, new values) gets
    a new key, hence fresh copies; a saved copy cut short is made again."""
    folder = write_checkpoint(tmp_path / "m", SIZES, random_hf_state(SIZES, seed=1))
    config = read_config(folder)
    name = "transformer.h.1.attn.c_attn.weight"
    old = load_state(folder, config, kept(folder, tmp_path / "copies"))[name]
    key = checkpoint_key(folder)
    hf = random_hf_state(SIZES, seed=2)
    write_checkpoint(folder, SIZES, hf)
    assert checkpoint_key(folder) != key
    new = load_state(folder, config, kept(folder, tmp_path / "copies"))[name]
    np.testing.assert_array_equal(new, hf[name].T)
    assert not np.array_equal(new, old)
    assert [p.name for p in (tmp_path / "copies").iterdir()] == [checkpoint_key(folder)]  # the old ones pruned
    gone = write_checkpoint(tmp_path / "gone", SIZES)
    load_state(gone, config, kept(gone, tmp_path / "copies"))
    shutil.rmtree(gone)
    load_state(other := write_checkpoint(tmp_path / "other", SIZES), config, kept(other, tmp_path / "copies"))
    assert len(list((tmp_path / "copies").iterdir())) == 2  # a deleted checkpoint's copies pruned too
    saved = tmp_path / "copies" / checkpoint_key(folder) / f"{name}.npy"
    saved.write_bytes(saved.read_bytes()[:100])  # cut short
    np.testing.assert_array_equal(load_state(folder, config, kept(folder, tmp_path / "copies"))[name], hf[name].T)
    np.testing.assert_array_equal(np.load(saved), hf[name].T)  # and saved whole again, for the next start


def kept(folder, where):
    """What the app hands load_state (model/caches.py's float32_copies), under ``where``."""
    return SavedArrays(where / checkpoint_key(folder), folder, one_per_source=True)


def test_the_app_keeps_copies_in_its_cache_folder(tmp_path, monkeypatch):
    from model import caches

    folder = write_checkpoint(tmp_path / "m", SIZES)
    monkeypatch.setenv("GPT2_MAX_CACHE", str(tmp_path / "cache"))
    saved = caches.float32_copies(folder)
    assert saved.folder == tmp_path / "cache" / "float32-copies" / checkpoint_key(folder) and saved.one_per_source
    monkeypatch.setenv("GPT2_MAX_SAVED_GRAPHS", "0")
    assert caches.float32_copies(folder) is None


def resident_pages(array: np.ndarray) -> int:
    """How many of the memory pages wholly inside ``array`` are mapped into
    this process's memory now (counted in its RSS): bit 63 of each page's
    entry in /proc/self/pagemap."""
    import mmap

    begin = array.__array_interface__["data"][0]
    first = -(-begin // mmap.PAGESIZE)
    last = (begin + array.nbytes) // mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = np.frombuffer(pagemap.read((last - first) * 8), dtype=np.uint64)
    return int(np.count_nonzero(entries >> np.uint64(63)))



def test_reference_checkpoint_variants(tmp_path):
    _, sizes, _ = reference("tiny-2l-4h")
    states = [load_state(f, read_config(f)) for f in (
        reference_variant("tiny-2l-4h", tmp_path / "a", prefix=True, lm_head=True),
        reference_variant("tiny-2l-4h", tmp_path / "b", prefix=False, lm_head=False, buffers=True),
    )]
    for name in states[0]:
        np.testing.assert_array_equal(states[0][name], states[1][name])


def _error(fn, *args) -> str:
    with pytest.raises(WeightsError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_bad_folders(tmp_path):
    assert "no such folder" in _error(resolve_model, str(tmp_path / "nope" / "x" / "y"))
    assert "no such folder" in _error(resolve_model, "./missing-model")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in _error(resolve_model, str(empty))
    only_config = write_checkpoint(tmp_path / "cfg", SIZES)
    (only_config / "model.safetensors").unlink()
    assert "no model.safetensors" in _error(resolve_model, str(only_config))
    assert "is a file" in _error(resolve_model, str(only_config / "config.json"))


def test_unknown_model_id_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    message = _error(resolve_model, "gpt2")
    assert "gpt2" in message and "not in the Hugging Face cache" in message
    assert "--model demo" in message  # the bundled model is named as the way on without a network


def test_truncated_and_corrupt_safetensors(tmp_path):
    folder = write_checkpoint(tmp_path / "m", SIZES)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    assert "truncated" in _error(load_state, folder, read_config(folder))
    path.write_bytes(data[:4])
    assert "truncated" in _error(load_state, folder, read_config(folder))
    path.write_bytes(len(b"{not json}").to_bytes(8, "little") + b"{not json}" + data[100:])
    assert "corrupt safetensors header" in _error(load_state, folder, read_config(folder))


def test_shapes_that_do_not_fit_the_config(tmp_path):
    folder = write_checkpoint(tmp_path / "m", SIZES)
    config = json.loads((folder / "config.json").read_text())
    config["n_embd"] = 48
    (folder / "config.json").write_text(json.dumps(config))
    message = _error(load_state, folder, read_config(folder))
    assert "wte.weight has shape [64, 32] but config.json implies [64, 48]" in message


def test_missing_and_extra_tensors(tmp_path):
    hf = random_hf_state(SIZES)
    del hf["transformer.h.1.ln_2.bias"]
    folder = write_checkpoint(tmp_path / "a", SIZES, hf)
    assert "no tensor h.1.ln_2.bias" in _error(load_state, folder, read_config(folder))
    hf = random_hf_state(SIZES)
    hf["transformer.h.2.ln_1.weight"] = np.ones(32, np.float32)
    folder = write_checkpoint(tmp_path / "b", SIZES, hf)
    assert "unexpected tensor h.2.ln_1.weight" in _error(load_state, folder, read_config(folder))


def test_untied_head_is_refused(tmp_path):
    hf = random_hf_state(SIZES)
    hf["lm_head.weight"] = hf["transformer.wte.weight"] + 1
    folder = write_checkpoint(tmp_path / "m", SIZES, hf)
    assert "lm_head.weight differs" in _error(load_state, folder, read_config(folder))


@pytest.mark.parametrize("change, expected", [
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "model_type is 'llama'"),
    ({"activation_function": "relu"}, "not GPT-2's gelu_new"),
    ({"n_inner": 100}, "n_inner 100"),
    ({"n_head": 5}, "divisible"),
])
def test_non_gpt2_configs_are_refused(tmp_path, change, expected):
    folder = write_checkpoint(tmp_path / "m", SIZES)
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    assert expected in _error(read_config, folder)
    (folder / "config.json").write_text("{oops")
    assert "not valid JSON" in _error(read_config, folder)


def test_real_gpt2_tokenizer(tmp_path):
    folder = copy_gpt2_tokenizer(tmp_path / "tok")
    tokenizer = load_tokenizer(folder)
    assert tokenizer.encode("Hello, world!") == [15496, 11, 995, 0]
    assert tokenizer.decode([15496, 11, 995, 0]) == "Hello, world!"
    assert len(tokenizer) == 50257
    assert tokenizer.eos_token_id == 50256


AWKWARD = ["Hello, world!", "  two leading spaces", "tabs\tand\nnewlines\n\n", "naïve café, 東京, emoji 🙂👍🏽",
           "<|endoftext|>", "a<|endoftext|>b", "It's 3.14159 -- isn't it?", "   ", "trailing space ",
           "ALL CAPS and MiXeD", "\u200bzero width", "'s 've 're 'll 'd 'm 't", "x" * 300, "1234567890" * 5]


def test_tokenizer_agrees_with_transformers(tmp_path):
    """The app's tokenizer (the tokenizers library, no transformers import)
    against transformers' GPT2TokenizerFast on the same files: ids and text."""
    from transformers import GPT2TokenizerFast

    folder = copy_gpt2_tokenizer(tmp_path / "tok")
    ours, theirs = load_tokenizer(folder), GPT2TokenizerFast.from_pretrained(str(folder))
    assert len(ours) == len(theirs) and ours.eos_token_id == theirs.eos_token_id
    for text in AWKWARD:
        ids = theirs.encode(text)
        assert ours.encode(text) == ids, text
        assert ours(text)["input_ids"] == ids
        assert ours.decode(ids) == theirs.decode(ids), text
    some = list(range(0, 50257, 997)) + [50256, 198, 220]
    assert ours.decode(some) == theirs.decode(some)
    # tokenizer.json, as hub repositories ship it, gives the same
    theirs.save_pretrained(str(tmp_path / "json"))
    from_json = load_tokenizer(tmp_path / "json")
    assert [from_json.encode(t) for t in AWKWARD] == [theirs.encode(t) for t in AWKWARD]


def test_tokenizer_is_checked_after_loading(tmp_path):
    folder = write_checkpoint(tmp_path / "m", SIZES, tokenizer=True)
    message = _error(load_tokenizer, folder, read_config(folder))
    assert "50257 tokens, expected at most config.json's vocab_size 64" in message
    (folder / "vocab.json").unlink()
    assert "no tokenizer files" in _error(load_tokenizer, folder, read_config(folder))
    (folder / "vocab.json").write_text("{}")
    assert "tokenizer" in _error(load_tokenizer, folder, read_config(folder))


def test_bool_buffers_are_skipped_whatever_their_dtype(tmp_path):
    # Older transformers saved the causal mask as a persistent bool buffer.
    from safetensors.numpy import save_file

    hf = random_hf_state(SIZES, seed=3)
    folder = write_checkpoint(tmp_path / "m", SIZES, hf)
    n = SIZES["n_positions"]
    buffers = {f"transformer.h.{i}.attn.{b}": np.tril(np.ones((n, n), bool))[None, None]
               for i in range(SIZES["n_layer"]) for b in ("bias", "masked_bias")}
    save_file({**hf, **buffers}, str(folder / "model.safetensors"))
    state = load_state(folder, read_config(folder))
    c_attn = "transformer.h.1.attn.c_attn.weight"
    np.testing.assert_array_equal(state[c_attn], hf[c_attn].T)
    assert not any(name.endswith((".attn.bias", ".attn.masked_bias")) for name in state)


def test_a_weight_of_an_unknown_dtype_is_still_a_clear_error(tmp_path):
    from safetensors.numpy import save_file

    hf = random_hf_state(SIZES, seed=3)
    folder = write_checkpoint(tmp_path / "m", SIZES, hf)
    save_file({**hf, "transformer.wte.weight": hf["transformer.wte.weight"] > 0}, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"corrupt entry for transformer.wte.weight \(dtype 'BOOL'\)"):
        load_state(folder, read_config(folder))


@pytest.mark.parametrize("field, value", [
    ("scale_attn_weights", False), ("scale_attn_by_inverse_layer_idx", True), ("reorder_and_upcast_attn", True),
    ("add_cross_attention", True), ("tie_word_embeddings", False),
])
def test_config_fields_that_change_the_math_are_refused_by_name(tmp_path, field, value):
    folder = write_checkpoint(tmp_path / "m", SIZES)
    config = json.loads((folder / "config.json").read_text())
    read_config(folder)  # GPT-2's defaults load
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    message = _error(read_config, folder)
    assert f"{field} is {json.dumps(value)}" in message and "\n" not in message


def test_eos_token_ids_from_generation_config_then_config(tmp_path):
    from weights import read_eos_token_ids

    folder = write_checkpoint(tmp_path / "m", SIZES)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 7}))
    assert read_eos_token_ids(folder) == [7]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 50]}))
    assert read_eos_token_ids(folder) == [3, 50]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    assert "eos_token_id" in _error(read_eos_token_ids, folder)


def test_a_padded_vocabulary_loads(tmp_path):
    # nanoGPT's GPT-2 exports: 50304 embedding rows (a multiple of 64), GPT-2's 50257 tokens.
    sizes = dict(SIZES, vocab_size=50304)
    folder = write_checkpoint(tmp_path / "m", sizes, tokenizer=True)
    config = read_config(folder)
    assert len(load_tokenizer(folder, config)) == 50257 and config.vocab_size == 50304
    assert load_state(folder, config)["transformer.wte.weight"].shape == (50304, SIZES["n_embd"])


def _write_safetensors(path, arrays: dict[str, tuple[str, np.ndarray]]) -> None:
    """A safetensors file by hand, so that any dtype name can be written (numpy has no bfloat16)."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, array) in arrays.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_precision_files_load_as_float32(tmp_path, dtype):
    hf = random_hf_state(SIZES, seed=4)
    folder = write_checkpoint(tmp_path / "m", SIZES, hf)
    if dtype == "F16":
        stored = {n: ("F16", a.astype(np.float16)) for n, a in hf.items()}
        expected = {n: a.astype(np.float16).astype(np.float32) for n, a in hf.items()}
    else:  # bfloat16: the top 16 bits of a float32
        stored = {n: ("BF16", (a.view(np.uint32) >> 16).astype(np.uint16)) for n, a in hf.items()}
        expected = {n: ((a.view(np.uint32) >> 16) << 16).view(np.float32) for n, a in hf.items()}
    _write_safetensors(folder / "model.safetensors", stored)
    for copies in (None, tmp_path / "copies", tmp_path / "copies"):  # converted; saved; mapped from the save
        state = load_state(folder, read_config(folder), copies and kept(folder, copies))
        for name, want in expected.items():
            want = want.T if name.endswith(TRANSPOSED) else want
            assert state[name].dtype == np.float32
            np.testing.assert_array_equal(state[name], want)
        assert state["lm_head.weight"] is state["transformer.wte.weight"]


def test_first_load_makes_its_copies_one_at_a_time_and_maps_them(tmp_path):
    """Peak memory of a first run (at gpt2-xl the copies are 6 GB):
    on the first load each copy is made, written and let go before the next
    is made, and what load_state returns is the saved files mapped, so none
    of it is resident until read."""
    import gc
    import weakref

    folder = write_checkpoint(tmp_path / "m", dict(SIZES, n_embd=256))
    saved = SavedArrays(tmp_path / "copies" / checkpoint_key(folder))
    alive = []
    real_save = saved.save

    def save(pairs):
        def watched():
            for name, array in pairs:
                gc.collect()
                alive.append(sum(ref() is not None for ref in made))
                made.append(weakref.ref(array))
                yield name, array
                del array

        made = []
        real_save(watched())

    saved.save = save
    first = to_model_names(read_safetensors(folder / "model.safetensors"), read_config(folder), saved=saved)
    assert len(alive) > 4 and max(alive) <= 1, alive  # at most the one being written when the next is made
    name = "transformer.h.0.mlp.c_fc.weight"
    assert isinstance(first[name], np.memmap) and resident_pages(first[name]) == 0
