"""Reading and writing model directories (DESIGN 3 and 4).

A directory holds `config.json` and `model.safetensors` (or, for original checkpoints,
`pytorch_model.bin`, read with `weights_only=True` only), optionally `tokenizer.json`. Every tensor
is checked against the shapes the config implies: missing, unexpected and mis-shaped tensors are
named, and non-finite weights refused. Outputs are written to a temporary directory and renamed
into place when complete, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .errors import EdgetttError
from .model import CausalLM
from .tokenizer import load_tokenizer

WEIGHTS_FILE = "model.safetensors"
PICKLE_FILE = "pytorch_model.bin"
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


def load_model(path: str | os.PathLike, dtype: torch.dtype | None = None) -> CausalLM:
    """Load an original TTT checkpoint or an edgettt model directory, or a shipped model by name."""
    path = resolve_model_path(path)
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        names = ", ".join(shipped_models())
        raise EdgetttError(f"{path}: {what}; give a model directory with config.json and model.safetensors"
                           + (f", or a shipped model ({names})" if names else ""))
    if not os.access(path, os.R_OK | os.X_OK):
        raise EdgetttError(f"{path}: directory not readable; check its permissions")
    config = ModelConfig.load(path / "config.json")
    weights = read_weights(path)
    with torch.device("meta"):
        model = CausalLM(config)
    if config.quantization:
        from .quantize import prepare_quantized

        prepare_quantized(model, weights)
    check_weights(model, weights, path)
    model.load_state_dict(weights, strict=False, assign=True)
    model.tie_weights()
    if dtype is not None:
        model.to(dtype)
    model.tokenizer = load_tokenizer(path, config.vocab_size)
    return model.eval()


def model_fingerprint(model: CausalLM) -> str:
    """sha256 prefix of the weights (names, shapes, dtypes and bytes): what a calibration is tied to."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.weights().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    if (path / WEIGHTS_FILE).exists():
        file = path / WEIGHTS_FILE
        try:
            return load_file(file)
        except (SafetensorError, OSError, ValueError) as exc:
            raise EdgetttError(f"{file}: not a readable safetensors file ({exc})") from None
    file = path / PICKLE_FILE
    if not file.exists():
        raise EdgetttError(f"{path}: no {WEIGHTS_FILE} or {PICKLE_FILE}; the weights are missing")
    try:
        weights = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise EdgetttError(
            f"{file}: not a weights-only pickle (it holds code or objects, and edgettt refuses to unpickle "
            "them); re-save it as safetensors with code you trust"
        ) from None
    except (OSError, RuntimeError, EOFError) as exc:
        raise EdgetttError(f"{file}: not a readable PyTorch weights file ({exc})") from None
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise EdgetttError(f"{file}: expected a dict of tensors (a state dict)")
    return weights


def check_weights(model: CausalLM, weights: dict[str, torch.Tensor], path: Path) -> None:
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    tied = model.config.tie_word_embeddings
    if tied:
        expected.pop("lm_head.weight")
        extra_head = weights.get("lm_head.weight")
        embed = weights.get("model.embed_tokens.weight")
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
    bad = [n for n in sorted(expected) if weights[n].is_floating_point() and not torch.isfinite(weights[n]).all()]
    if bad:
        raise EdgetttError(f"{path}: non-finite values (NaN or inf) in {_names(bad)}; the checkpoint is corrupt")


def _names(names: list[str], limit: int = 6) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def save_model(model: CausalLM, path: str | os.PathLike, force: bool = False,
               extra_files: dict[str, str] | None = None, weights_format: str = "safetensors") -> None:
    """Write config.json, the weights (and the tokenizer, extra text files) atomically.

    `weights_format` "bin" writes a weights-only `pytorch_model.bin`, as older checkpoints have.
    """
    with output_dir(path, force) as tmp:
        (tmp / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
        tensors = {k: v.detach().contiguous().cpu() for k, v in model.weights().items()}
        if weights_format == "bin":
            torch.save(tensors, tmp / PICKLE_FILE)
        else:
            save_file(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        if model.tokenizer is not None:
            model.tokenizer.save(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)


def check_output(path: str | os.PathLike, force: bool, directory: bool = True) -> Path:
    """Refuse an existing output unless forced, or one of the wrong kind; call before any long work."""
    path = Path(path)
    if path.exists() and not force:
        raise EdgetttError(f"{path}: already exists; pass --force to overwrite it")
    if path.exists() and path.is_dir() != directory:
        kind = "not a directory" if directory else "a directory"
        raise EdgetttError(f"{path}: exists and is {kind}; remove it or choose another name")
    return path


@contextlib.contextmanager
def output_file(path: str | os.PathLike, force: bool):
    """Yield a temporary name beside `path`; on success it replaces `path`, on failure it goes."""
    path = check_output(path, force, directory=False)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _usual_permissions(directory: Path) -> None:
    """mkdtemp makes a private directory; the result should look like any directory the user makes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for file in directory.iterdir():
        os.chmod(file, 0o666 & ~umask)


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, force: bool):
    """Yield a temporary directory beside `path`; on success it replaces `path`, on failure it goes."""
    path = check_output(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        _usual_permissions(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        path.rename(old)
    tmp.rename(path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
