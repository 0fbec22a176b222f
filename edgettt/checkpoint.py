"""Reading and writing model directories (DESIGN 3 and 4).

A directory holds `config.json` and `model.safetensors` (or, for original checkpoints,
`pytorch_model.bin`, read with `weights_only=True` only), optionally `tokenizer.json`. Every tensor
is checked against the shapes the config implies: missing, unexpected and mis-shaped tensors are
named, and non-finite weights refused. Outputs go through `outputs.Output`: written to a private
staging directory and renamed into place when complete, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from edgettt.errors import EdgetttError
from edgettt.families.base import LanguageModel
from edgettt.families.registry import FAMILIES, family_for_type, family_of
from edgettt.outputs import as_output
from edgettt.quant.apply import prepare_quantized
from edgettt.quant.weight_formats import stored_tensor_names
from edgettt.tokenizer import load_tokenizer
from edgettt.weights_io import (MAX_SHARD_BYTES, check_weights, read_weights, stored_matrices, weights_header,
                                write_weights)

SHIPPED_MODELS = Path(__file__).parent / "models"


def shipped_models() -> list[str]:
    """Names of the models that ship inside the package (`edgettt.load(name)`)."""
    if not SHIPPED_MODELS.is_dir():
        return []
    return sorted(p.name for p in SHIPPED_MODELS.iterdir() if (p / "config.json").exists())


def resolve_model_path(spec: str | os.PathLike) -> Path:
    """A directory, or the name of a shipped model when no such directory exists."""
    path = Path(spec)
    if not path.exists() and str(spec) in shipped_models():
        return SHIPPED_MODELS / str(spec)
    return path


def load_model(path: str | os.PathLike, dtype: torch.dtype | str | None = None) -> LanguageModel:
    """Load an original TTT checkpoint (ttt-lm-pytorch's layout, or a ttt-lm-jax checkpoint file or
    its folder), a LaCT checkpoint (public layout), an edgettt model directory, or a shipped model by name.
    It computes in float32 whatever the file's precision; `dtype` casts it instead, or "stored" keeps each
    tensor as stored (for converting and saving, not for computing)."""
    path = resolve_model_path(path)
    foreign = foreign_checkpoint(path)
    if foreign is not None:
        return load_foreign_model(*foreign, dtype)
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        names = ", ".join(shipped_models())
        raise EdgetttError(f"{path}: {what}; give a model directory with config.json and model.safetensors, "
                           "a ttt-lm-jax checkpoint" + (f", or a shipped model ({names})" if names else ""))
    if not os.access(path, os.R_OK | os.X_OK):
        raise EdgetttError(f"{path}: directory not readable; check its permissions")
    family = family_for_type(model_type(path / "config.json"), path / "config.json")
    config = family.config_class.load(path / "config.json")
    family.check_sizes(config, weights_header(path), path / "config.json")  # before anything is built from the config
    return _built(family.model_class, config, read_weights(path), path, dtype)


def foreign_checkpoint(path: Path):
    """(family, checkpoint file) where `path` is a checkpoint in another layout that a family reads (ttt-lm-jax's
    streaming checkpoints: the file or its folder), else None."""
    if not (path.exists() and os.access(path, os.R_OK)):
        return None
    for family in FAMILIES:
        found = family.foreign_checkpoint(path)
        if found is not None:
            return family, found
    return None


def load_foreign_model(family, checkpoint: Path, dtype: torch.dtype | str | None = None) -> LanguageModel:
    """The model of a checkpoint in another layout (`foreign_checkpoint`), with the tokenizer.json beside it."""
    config, weights, checkpoint = family.load_foreign(checkpoint)
    return _built(family.model_class, config, weights, checkpoint, dtype, tokenizer_dir=checkpoint.parent)


def _built(model_class, config, weights: dict[str, torch.Tensor], source: Path, dtype,
           tokenizer_dir: Path | None = None):
    """A model of `config` holding `weights` (checked against it): computing in float32 (dtype None), in
    `dtype`, or, dtype "stored", holding each tensor as the file stores it (to convert and save without
    computing, with no second copy). `model.stored_dtype` is the precision of the file's float matrices."""
    stored = next((t.dtype for t in weights.values() if t.is_floating_point() and t.dim() >= 2), None)
    if dtype is None:
        weights = upcast_16bit(weights, keep=quantized_storage(weights) if config.quantization else ())
    with torch.device("meta"):
        model = model_class(config)
    if config.quantization:
        prepare_quantized(model, weights, str(source))
    check_weights(model, weights, source)
    model.load_state_dict(weights, strict=False, assign=True)
    model.tie_weights()
    if dtype not in (None, "stored"):
        model.to(dtype)
    model.tokenizer = load_tokenizer(tokenizer_dir or source, config.vocab_size)
    model.stored_dtype = stored
    return model.eval()


def upcast_16bit(weights: dict[str, torch.Tensor], keep=()) -> dict[str, torch.Tensor]:
    """Weights stored in bfloat16 or float16 (half the bytes of a shipped model) as float32, which holds
    them exactly: a model computes in float32 whatever its file's precision (`load_model(dtype=)` picks
    another). The tensors named in `keep` stay as stored: a quantized format's own (its scales), which it reads
    as stored."""
    return {name: t.float() if t.dtype in (torch.bfloat16, torch.float16) and name not in keep else t
            for name, t in weights.items()}


def quantized_storage(weights: dict[str, torch.Tensor]) -> set[str]:
    """The tensors of a quantized model's file that its weight and state formats store (a layer's qweight and
    scales, the state's scales); the rest (norms, layers kept in float) are plain weights."""
    stored = tuple(f".{name}" for name in stored_tensor_names())
    return {name for name in weights if name.endswith(stored) or ".state_" in name}


def read_config(path: Path):
    """A model directory's config.json through its family's loader (checked, no weights read)."""
    return family_for_type(model_type(path / "config.json"), path / "config.json").config_class.load(path / "config.json")


def model_directory(spec) -> Path | None:
    """The model directory `spec` names (a path or a shipped model's name): one whose config.json describes it,
    not a ttt-lm-jax checkpoint's folder with its JAX config beside it. None for anything else."""
    path = resolve_model_path(spec)
    return path if (path / "config.json").is_file() and foreign_checkpoint(path) is None else None


def stored_config(spec):
    """The config a model directory (or a shipped model's name) holds, read without its weights: what a command
    checks before any work. None for what has no config.json to read (a ttt-lm-jax checkpoint; a path the
    loader then names as missing)."""
    path = model_directory(spec)
    return read_config(path) if path is not None else None


def skeleton(spec) -> LanguageModel | None:
    """The model a model directory's config.json describes, on the meta device (shapes, no weights read or
    memory taken): what a command measures before the weights are loaded. None as for `stored_config`."""
    config = stored_config(spec)
    if config is None:
        return None
    with torch.device("meta"):
        return family_of(config).model_class(config)


def model_type(config_file: Path) -> str | None:
    """The `model_type` of a config.json, or None when it cannot say (the config's own loader then
    gives the error)."""
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return raw.get("model_type") if isinstance(raw, dict) else None


def model_fingerprint(model: LanguageModel) -> str:
    """sha256 prefix of the weights (names, shapes, dtypes and bytes): what a calibration is tied to."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.weights().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


def save_model(model: LanguageModel, path, force: bool = False, extra_files: dict[str, str] | None = None,
               weights_format: str = "safetensors", max_shard_bytes: int = MAX_SHARD_BYTES,
               store: torch.dtype | None = None) -> None:
    """Write config.json, the weights (and the tokenizer, extra text files) atomically.

    `path` is a path or an `Output` planned before the work (`outputs.Output.plan(..., "model")`);
    `weights_format` "bin" writes a weights-only `pytorch_model.bin`, as older checkpoints have; weights
    above `max_shard_bytes` are written as Hugging Face shards with an index; `store` (torch.bfloat16: half
    the bytes) is the precision of the floating matrices in the file (`weights_io.stored_matrices`).
    """
    with as_output(path, "model", force).write() as tmp:
        (tmp / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
        tensors = {k: stored_matrices(v.detach().contiguous().cpu(), store) for k, v in model.weights().items()}
        write_weights(tensors, tmp, weights_format, max_shard_bytes)
        if model.tokenizer is not None:
            model.tokenizer.save(tmp)
        extra_files = dict(extra_files or {})
        card = family_of(model.config).source_card
        if model.config.extra.get("source") and card is not None and "MODEL_CARD.md" not in extra_files:
            extra_files["MODEL_CARD.md"] = card(model.config)
        for name, text in extra_files.items():
            (tmp / name).write_text(text)
