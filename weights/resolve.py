"""Turn ``--model`` (a Hugging Face id or a local folder) into a local folder."""

from __future__ import annotations

from pathlib import Path

from weights.errors import WeightsError

# What a GPT-2 checkpoint needs from a hub repository (not the PyTorch, TF,
# Flax, ONNX or Core ML copies many GPT-2 repos also carry).
HUB_FILES = [
    "config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
]


# The bundled demo (tests/reference/make_demo.py): a small GPT-2 trained on the
# King James Bible, so the app writes English with no network.
DEMO = Path(__file__).resolve().parent / "demo"


def resolve_model(model: str) -> Path:
    """A local folder with config.json and safetensors weights for ``model``.

    ``model`` is a folder, or a Hugging Face model id fetched through the
    standard cache (``HF_HOME``), so a second run, and ``HF_HUB_OFFLINE=1``,
    need no network. A download shows huggingface_hub's progress bars.
    ``demo`` is the bundled demo model.
    """
    if not model.strip():
        raise WeightsError("the model name is empty: give a Hugging Face id (gpt2, ...), a folder, or demo")
    if model == "demo" and not Path(model).is_dir():
        return check_folder(DEMO)
    path = Path(model).expanduser()
    if path.is_dir():
        return check_folder(path)
    if path.exists():
        raise WeightsError(f"{model}: is a file; --model takes a folder or a Hugging Face model id")
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise WeightsError(f"{model}: no such folder")
    return check_folder(_download(model))


def check_folder(folder: Path) -> Path:
    if not (folder / "config.json").is_file():
        raise WeightsError(f"{folder}: no config.json (is this a Hugging Face GPT-2 checkpoint folder?)")
    if not ((folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()):
        raise WeightsError(
            f"{folder}: no model.safetensors (or model.safetensors.index.json); "
            "only safetensors weights are read (convert pytorch_model.bin with transformers' save_pretrained)"
        )
    return folder


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return Path(snapshot_download(repo_id=repo_id, allow_patterns=HUB_FILES))
    except GatedRepoError:
        raise WeightsError(f"{repo_id}: gated on the Hugging Face hub; log in with `hf auth login`") from None
    except RepositoryNotFoundError:
        raise WeightsError(
            f"{repo_id}: no such model on the Hugging Face hub (check the id, or pass a folder)"
        ) from None
    except LocalEntryNotFoundError:
        raise WeightsError(
            f"{repo_id}: not in the Hugging Face cache and the hub cannot be reached "
            "(connect once to download it, pass a local folder with --model, "
            "or try the bundled one with --model demo)"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WeightsError(f"{repo_id}: download failed: {first}") from None
