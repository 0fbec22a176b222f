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

from .config import ModelConfig
from .errors import EdgetttError
from .jax_checkpoint import find_checkpoint, load_jax_checkpoint
from .lact.checkpoint import check_lact_sizes
from .lact.config import LACT_MODEL_TYPE, LaCTConfig
from .lact.model import LaCTForCausalLM
from .model import CausalLM
from .outputs import as_output
from .quant.apply import prepare_quantized
from .quant.weight_formats import stored_tensor_names
from .tokenizer import load_tokenizer
from .weights_io import (FLOAT_DTYPES, MAX_SHARD_BYTES, STORAGE_DTYPES, check_weights, read_weights, stored_matrices,
                         weights_header, write_weights)

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


def load_model(path: str | os.PathLike, dtype: torch.dtype | str | None = None) -> CausalLM:
    """Load an original TTT checkpoint (ttt-lm-pytorch's layout, or a ttt-lm-jax checkpoint file or
    its folder), a LaCT checkpoint (public layout), an edgettt model directory, or a shipped model by name.
    It computes in float32 whatever the file's precision; `dtype` casts it instead, or "stored" keeps each
    tensor as stored (for converting and saving, not for computing)."""
    path = resolve_model_path(path)
    if path.exists() and os.access(path, os.R_OK):
        jax_file = find_checkpoint(path)
        if jax_file is not None:
            return load_jax_model(jax_file, dtype)
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        names = ", ".join(shipped_models())
        raise EdgetttError(f"{path}: {what}; give a model directory with config.json and model.safetensors, "
                           "a ttt-lm-jax checkpoint" + (f", or a shipped model ({names})" if names else ""))
    if not os.access(path, os.R_OK | os.X_OK):
        raise EdgetttError(f"{path}: directory not readable; check its permissions")
    config_class, check_config_sizes, model_class = family_classes(model_type(path / "config.json"))
    config = read_config(path)
    check_config_sizes(config, weights_header(path), path / "config.json")  # before anything is built from the config
    return _built(model_class, config, read_weights(path), path, dtype)


def load_jax_model(checkpoint: Path, dtype: torch.dtype | str | None = None) -> CausalLM:
    """The TTT model of a ttt-lm-jax checkpoint file (`jax_checkpoint`), with the tokenizer.json beside it."""
    config, weights, checkpoint = load_jax_checkpoint(checkpoint)
    return _built(CausalLM, config, weights, checkpoint, dtype, tokenizer_dir=checkpoint.parent)


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
    return family_classes(model_type(path / "config.json"))[0].load(path / "config.json")


def model_directory(spec) -> Path | None:
    """The model directory `spec` names (a path or a shipped model's name): one whose config.json describes it,
    not a ttt-lm-jax checkpoint's folder with its JAX config beside it. None for anything else."""
    path = resolve_model_path(spec)
    return path if (path / "config.json").is_file() and find_checkpoint(path) is None else None


def stored_config(spec):
    """The config a model directory (or a shipped model's name) holds, read without its weights: what a command
    checks before any work. None for what has no config.json to read (a ttt-lm-jax checkpoint; a path the
    loader then names as missing)."""
    path = model_directory(spec)
    return read_config(path) if path is not None else None


def family_classes(kind: str | None):
    """(config class, size check against the weights file, model class) of a config.json's model_type:
    LaCT's for `lact_swiglu`, else the TTT family's (whose config loader names what it reads)."""
    if kind == LACT_MODEL_TYPE:
        return LaCTConfig, check_lact_sizes, LaCTForCausalLM
    return ModelConfig, check_sizes, CausalLM


def model_type(config_file: Path) -> str | None:
    """The `model_type` of a config.json, or None when it cannot say (the config's own loader then
    gives the error)."""
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return raw.get("model_type") if isinstance(raw, dict) else None


def model_fingerprint(model: CausalLM) -> str:
    """sha256 prefix of the weights (names, shapes, dtypes and bytes): what a calibration is tied to."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.weights().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


def check_sizes(config: ModelConfig, header: dict, source: Path) -> None:
    """The config's sizes against the tensors the file holds, before a model is built from them: a
    config that disagrees with its weights (a typo of 10**9) must not allocate anything."""
    bad_dtype = sorted(k for k, (_, dtype) in header.items() if dtype not in FLOAT_DTYPES + STORAGE_DTYPES)
    if bad_dtype:
        name = bad_dtype[0]
        raise EdgetttError(f"{source.parent}: {name} has dtype {header[name][1] or 'unsupported'}; weights must be "
                           "float16, bfloat16, float32 or float64 (integers only in quantized models); re-save them "
                           "as float")
    C, V, L = config.hidden_size, config.vocab_size, config.num_hidden_layers
    H, d, b = config.num_attention_heads, config.head_dim, config.mini_batch_size
    expect = {"model.embed_tokens.weight": ((V, C), "vocab_size, hidden_size"),
              "model.norm.weight": ((C,), "hidden_size")}
    block = "model.layers.0.seq_modeling_block."
    for name in ("ttt_norm_weight", "value_norm.weight"):
        expect[block + name] = ((H, d), "num_attention_heads, head dim")
    for name in ("learnable_token_idx", "mask_eta"):
        expect[block + name] = ((b,), "mini_batch_size")
    expect["model.layers.0.mlp.gate_proj.weight"] = ((config.intermediate_size, C), "intermediate_size, hidden_size")
    for name, (shape, keys) in expect.items():
        if name in header and header[name][0] != shape:
            raise EdgetttError(f"{source}: {keys} {list(shape)} disagree with {name} {list(header[name][0])} in the "
                               "weights file; the checkpoint does not match its config")
    for name in ("scales", "scb"):  # a quantized gate_proj (int8, int4, LLM.int8): one row of scales per output
        shape = header.get(f"model.layers.0.mlp.gate_proj.{name}", (None,))[0]
        if shape is not None and shape[0] != config.intermediate_size:
            raise EdgetttError(f"{source}: intermediate_size {config.intermediate_size} disagrees with "
                               f"model.layers.0.mlp.gate_proj.{name} {list(shape)} in the weights file; the "
                               "checkpoint does not match its config")
    if "model.embed_tokens.weight" not in header and not (config.tie_word_embeddings and "lm_head.qweight" in header):
        raise EdgetttError(f"{source.parent}: the weights file has no model.embed_tokens.weight; not a TTT model's "
                           "weights")
    layers = {int(k.split(".")[2]) for k in header if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    if layers != set(range(L)):
        raise EdgetttError(f"{source}: num_hidden_layers {L} disagrees with the weights file's {len(layers)} layers; "
                           "the checkpoint does not match its config")


def source_card(config) -> str:
    """MODEL_CARD.md of a model whose weights came from elsewhere (`config.extra["source"]`, e.g. a
    ttt-lm-jax checkpoint): where from, what its authors say of them, and what the model is."""
    form = {"ttt": "the original mini-batch TTT computation"}.get(config.form, f"edgettt's {config.form} form")
    return (f"# {config.family}, {config.hidden_size} wide, {config.num_hidden_layers} layers\n\n"
            f"{config.extra['source']}\n\n"
            f"Checkpoint: `{config.extra.get('source_file', 'unknown')}`. Form: {form}. Vocabulary "
            f"{config.vocab_size:,}; TTT base learning rate {config.ttt_base_lr}, mini-batch {config.mini_batch_size}.\n")


def save_model(model: CausalLM, path, force: bool = False, extra_files: dict[str, str] | None = None,
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
        if model.config.extra.get("source") and "MODEL_CARD.md" not in extra_files:
            extra_files["MODEL_CARD.md"] = source_card(model.config)
        for name, text in extra_files.items():
            (tmp / name).write_text(text)
