"""Weights files of a model directory, read and written: one file or Hugging Face shards.

Read: `model.safetensors`, `pytorch_model.bin` (weights-only, memory-mapped), or shards named by
`model.safetensors.index.json` / `pytorch_model.bin.index.json` (`weight_map`: tensor -> shard file,
as transformers writes them). Shards are read one after another into one dict: every tensor exists
once. `weights_header` gives names, shapes and dtypes from the safetensors headers alone.
Write: one `model.safetensors`, or, above `max_shard_bytes` (Hugging Face's default 5 GB), shards
`model-0000i-of-0000N.safetensors` and the index.
Check: `check_weights` holds what was read against a model's own tensors (names, shapes, kinds of
dtype, finite values), for every model family's loader.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from edgettt.errors import EdgetttError

WEIGHTS_FILE = "model.safetensors"
PICKLE_FILE = "pytorch_model.bin"
INDEX_FILES = {"model.safetensors.index.json": WEIGHTS_FILE, "pytorch_model.bin.index.json": PICKLE_FILE}
SHARD_NAME = re.compile(r"(model|pytorch_model)-\d{5}-of-\d{5}\.(safetensors|bin)")
MAX_SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size

# dtypes a weights file may hold: float weights in any float precision; integers for quantized storage
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
STORAGE_DTYPES = (torch.int8, torch.uint8, torch.int64)  # int64: a quantized state's bucket width
SAFETENSORS_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
                      "I8": torch.int8, "U8": torch.uint8, "I64": torch.int64}


def weight_files(path: Path) -> list[Path]:
    """The files holding the weights of the model directory `path`, in order."""
    for name in (WEIGHTS_FILE, PICKLE_FILE):
        if (path / name).exists():
            return [path / name]
    for index in INDEX_FILES:
        if (path / index).exists():
            return _shards(path, path / index)
    raise EdgetttError(f"{path}: no {WEIGHTS_FILE}, {PICKLE_FILE} or shard index; the weights are missing")


def _shards(path: Path, index: Path) -> list[Path]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise EdgetttError(f"{index}: not readable JSON ({exc}); write the index again") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise EdgetttError(f"{index}: no weight_map of tensor names to shard files; write the index again")
    files = []
    for name in sorted(set(weight_map.values())):
        if Path(name).name != name or not (path / name).is_file():
            raise EdgetttError(f"{index}: shard {name!r} is not a file inside {path}; the checkpoint is incomplete")
        files.append(path / name)
    return files


def weights_header(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Name -> (shape, dtype) of every tensor, from the safetensors headers alone (a .bin is mapped)."""
    header = {}
    for file in weight_files(path):
        if file.suffix == ".bin":
            header.update({k: (tuple(t.shape), t.dtype) for k, t in _read_bin(file).items()})
            continue
        try:
            with safe_open(str(file), framework="pt") as f:
                header.update({k: (tuple(f.get_slice(k).get_shape()), SAFETENSORS_DTYPES.get(f.get_slice(k).get_dtype()))
                               for k in f.keys()})
        except (SafetensorError, OSError, ValueError) as exc:
            raise EdgetttError(f"{file}: not a readable safetensors file ({exc}); the file is damaged, write it "
                               "again") from None
    return header


def stored_bytes(path: Path) -> int | None:
    """Bytes of the weights as the model directory's files store them (from the headers), or None when a
    tensor's type is not one edgettt knows."""
    header = weights_header(path)
    if any(dtype is None for _, dtype in header.values()):
        return None
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in header.values())


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the model directory `path`, shard after shard (each tensor held once)."""
    weights: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        part = _read_bin(file) if file.suffix == ".bin" else _read_safetensors(file)
        twice = sorted(set(part) & set(weights))
        if twice:
            raise EdgetttError(f"{file}: {twice[0]} is also in another shard; the checkpoint is inconsistent")
        weights.update(part)
    return weights


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(file)
    except (SafetensorError, OSError, ValueError) as exc:
        raise EdgetttError(f"{file}: not a readable safetensors file ({exc}); the file is damaged, write it again") \
            from None


def _read_bin(file: Path) -> dict[str, torch.Tensor]:
    try:
        weights = _load_pickle(file)
    except pickle.UnpicklingError:
        raise EdgetttError(
            f"{file}: not a weights-only pickle (it holds code or objects, and edgettt refuses to unpickle "
            "them); re-save it as safetensors with code you trust"
        ) from None
    except (OSError, RuntimeError, EOFError) as exc:
        raise EdgetttError(f"{file}: not a readable PyTorch weights file ({exc}); the file is damaged, write it "
                           "again") from None
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(t, torch.Tensor)
                                                for k, t in weights.items()):
        raise EdgetttError(f"{file}: expected a dict of tensors by name (a state dict); re-save it as one")
    return weights


def _load_pickle(file: Path):
    """A weights-only pickle, memory-mapped where its format allows (the zip format of torch >= 1.6)."""
    with warnings.catch_warnings():  # torch's remarks on pickle protocols: the error, if any, says enough
        warnings.simplefilter("ignore")
        try:
            return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(file, map_location="cpu", weights_only=True)


SAFETENSORS_NAMES = {**{dtype: name for name, dtype in SAFETENSORS_DTYPES.items()},
                     torch.int16: "I16", torch.int32: "I32", torch.bool: "BOOL"}


def save_safetensors(tensors: dict[str, torch.Tensor], file: Path, metadata: dict[str, str] | None = None) -> None:
    """A safetensors file written tensor by tensor from the tensors' own memory: no second copy of the
    weights is made (safetensors' `save_file` builds the whole file in memory first, twice a model's bytes)."""
    header, offset = {}, 0
    for name in sorted(tensors):
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": SAFETENSORS_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(file, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name in sorted(tensors):
            t = tensors[name].detach().cpu().contiguous()
            if t.numel():
                f.write(t.reshape(-1).view(torch.uint8).numpy().data)


def write_weights(tensors: dict[str, torch.Tensor], directory: Path, weights_format: str = "safetensors",
                  max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Write `tensors` into `directory`: one file, or safetensors shards and their index above
    `max_shard_bytes` (tensors in name order, a new shard when the next would overflow). Returns the
    file names written."""
    if weights_format == "bin":
        torch.save(tensors, directory / PICKLE_FILE)
        return [PICKLE_FILE]
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if total <= max_shard_bytes:
        save_safetensors(tensors, directory / WEIGHTS_FILE, metadata={"format": "pt"})
        return [WEIGHTS_FILE]
    groups, size = [[]], 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map, names = {}, []
    for i, group in enumerate(groups, start=1):
        shard = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_safetensors({k: tensors[k] for k in group}, directory / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, shard))
        names.append(shard)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return [*names, "model.safetensors.index.json"]


def check_weights(model, weights: dict[str, torch.Tensor], path: Path) -> None:
    """Every tensor the model has, none more, each of its shape and kind of dtype, finite (any model
    class with `config.tie_word_embeddings` and its embedding's name in `EMBEDDING_KEY`)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    tied = model.config.tie_word_embeddings
    if tied:
        expected.pop("lm_head.weight", None)
        extra_head = weights.get("lm_head.weight")
        embed = weights.get(model.EMBEDDING_KEY)
        if extra_head is not None and embed is not None and not torch.equal(extra_head, embed):
            raise EdgetttError(f"{path}: lm_head.weight differs from the embedding but tie_word_embeddings is "
                               "true; set tie_word_embeddings to false in config.json")
    present = set(weights) - ({"lm_head.weight"} if tied else set())
    missing = sorted(set(expected) - present)
    extra = sorted(present - set(expected))
    if missing:
        raise EdgetttError(f"{path}: missing tensors: {_names(missing)}; the checkpoint does not match its config")
    if extra:
        raise EdgetttError(f"{path}: unexpected tensors: {_names(extra)}; the checkpoint does not match its config")
    wrong = [f"{n} {tuple(weights[n].shape)} (expected {expected[n]})" for n in sorted(expected)
             if tuple(weights[n].shape) != expected[n]]
    if wrong:
        raise EdgetttError(f"{path}: mis-shaped tensors: {_names(wrong)}; the checkpoint does not match its config")
    dtypes = {name: t.dtype for name, t in model.state_dict().items()}
    wrong = [f"{n} {weights[n].dtype} (expected {dtypes[n]})" for n in sorted(expected)
             if (weights[n].dtype in FLOAT_DTYPES) != (dtypes[n] in FLOAT_DTYPES)
             or (dtypes[n] not in FLOAT_DTYPES and weights[n].dtype != dtypes[n])]
    if wrong:
        raise EdgetttError(f"{path}: tensors of the wrong dtype: {_names(wrong)}; the checkpoint does not match "
                           "its config")
    bad = [n for n in sorted(expected) if weights[n].is_floating_point() and not torch.isfinite(weights[n]).all()]
    if bad:
        raise EdgetttError(f"{path}: non-finite values (NaN or inf) in {_names(bad)}; the checkpoint is corrupt")


def _names(names: list[str], limit: int = 6) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def stored_dtype_of(t: torch.Tensor, store: torch.dtype | None) -> torch.dtype:
    """The dtype a file written with `store` holds t in: `store` for a floating matrix (2 or more
    dimensions); vectors and scalars (norms, biases, a decayed form's decay rates) keep their precision: they
    are few bytes, and a decay rate rounded to bfloat16 (steps of 1/256 near 1) would change how fast a state
    forgets. The loader reads both back as float32."""
    return store if store is not None and t.dim() >= 2 and t.is_floating_point() else t.dtype


def stored_matrices(t: torch.Tensor, store: torch.dtype | None) -> torch.Tensor:
    """t as a file written with `store` holds it (`stored_dtype_of`)."""
    return t.to(stored_dtype_of(t, store))


def saved_float_dtype(model) -> torch.dtype | None:
    """The precision `save_model` gives a model's floating matrices: the half precision its file had
    (bfloat16 in, bfloat16 out) while no weight is quantized (a quantized format's scales stay as made);
    None keeps them as held. Also what its size is counted in (`quant.apply.weight_bits`)."""
    stored = getattr(model, "stored_dtype", None)
    quantized = (model.config.quantization or {}).get("weights", "none") != "none"
    return stored if stored in (torch.bfloat16, torch.float16) and not quantized else None
