"""Running models over sample text, and the conversion report that `convert` prints and writes."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from edgettt import metrics
from edgettt.data import Text, token_windows
from edgettt.errors import EdgetttError
from edgettt.families.base import LanguageModel
from edgettt.outputs import as_output
from edgettt.progress import bar
from edgettt.quant.apply import weight_bits
from edgettt.runner import Runner, export_files
from edgettt.weights_io import save_safetensors, saved_float_dtype


def encode(model: LanguageModel, text: Text, source: str = "model") -> list[int]:
    if model.tokenizer is None:
        raise EdgetttError(
            f"{source}: vocabulary of {model.config.vocab_size} is too small for byte-level text and the "
            "directory has no tokenizer.json; add the model's tokenizer.json to it (convert: or skip the "
            "measurement with --no-report)"
        )
    return model.tokenizer.encode_bytes(text.data)


@torch.no_grad()
def collect_logits(model: LanguageModel, windows: torch.Tensor, batch_size: int = 8, desc: str = "") -> torch.Tensor:
    """Logits [N, T, V] of every window's inputs (all but its last token). Runs on the GPU when
    there is one, and leaves the model there."""
    device = best_device()
    model.to(device)
    out = []
    for i in bar(range(0, windows.shape[0], batch_size), desc=desc, unit="batch", leave=False):
        out.append(model(windows[i:i + batch_size, :-1].to(device)).float().cpu())
    return torch.cat(out)


M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def release_freed_memory() -> None:
    """Hand the memory freed since to the operating system (glibc). A loop that allocates and frees logits
    of a few sizes leaves glibc's heap fragmented, and the process's memory grows with every batch: glibc
    raises its mmap threshold to the largest block freed (up to 32 MiB), so the next logits come from the
    heap and stay there. Fixing the threshold at 1 MiB (which also ends that raising) gives every large
    tensor its own mapping, returned when freed; malloc_trim returns the rest. At 125m the drift report's
    peak falls from 1.33 GB to about 1.0 GB. Elsewhere than glibc, nothing to do."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def best_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def target_bytes(model: LanguageModel, windows: torch.Tensor) -> int:
    return sum(len(model.tokenizer.decode(row.tolist()).encode("utf-8")) for row in windows[:, 1:])


# the conversion report's memory bounds: logits a forward returns at once (16 MB in float32), and logits its
# statistics take at once (8 MB in float64, each of a few temporaries)
FORWARD_LOGITS, STATS_LOGITS = 2**22, 2**20


@torch.no_grad()
def conversion_report(original: LanguageModel, converted: LanguageModel, text: Text, ctx: int,
                      max_tokens: int | None) -> dict:
    """Exact form: logit error against the original. Parallel form: the drift it causes. Measured a batch
    of windows at a time (`metrics.token_stats`): the memory of one batch's logits, not the text's."""
    windows = token_windows(encode(original, text), ctx, max_tokens)
    T, V = windows.shape[1] - 1, original.config.vocab_size
    batch = max(1, FORWARD_LOGITS // (T * V))
    device = best_device()
    original, converted = original.to(device), converted.to(device)
    parts = []
    release_freed_memory()
    for i in bar(range(0, windows.shape[0], batch), desc=f"{original.form} against {converted.form}", unit="batch",
                 leave=False):
        inputs = windows[i:i + batch, :-1].to(device)
        ref = original(inputs).float().cpu()
        new = converted(inputs).float().cpu()
        targets = windows[i:i + batch, 1:]
        span = max(1, STATS_LOGITS // (targets.shape[0] * V))  # positions a statistics step takes
        pieces = [metrics.token_stats(ref[:, j:j + span], new[:, j:j + span], targets[:, j:j + span])
                  for j in range(0, T, span)]
        parts.append(metrics.concat_stats(pieces, dim=1))
        del ref, new, pieces
        release_freed_memory()
    stats = metrics.concat_stats(parts)
    report = {
        "form": converted.form,
        "source_form": original.form,
        "text": text.fingerprint(),
        "ctx": T,
        "windows": windows.shape[0],
        **metrics.logit_error_of(stats),
    }
    if converted.form == "parallel":
        report.update(metrics.drift_of(stats, n_bytes=target_bytes(original, windows)))
    return report


class ExportLogits:
    """An export in a model's place for `evaluate`: its prefill graph, run by ONNX Runtime, gives the logits,
    so what is measured is the deployed file itself (as llama.cpp's perplexity runs on the GGUF)."""

    def __init__(self, directory, threads: int | None = None):
        self.directory = Path(directory)
        self.runner = Runner(self.directory, threads)
        self.tokenizer = self.runner.tokenizer
        self.vocab_size = self.runner.manifest["vocab_size"]
        self.source = self.runner.manifest.get("source", {})

    def to(self, device):
        return self  # ONNX Runtime on the CPU

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of each window, run one at a time: ONNX Runtime's arena keeps the peak of the largest run,
        and a batch of 8 windows of 512 tokens took 1.25 GB where one at a time takes 0.44 GB (ttt-linear-tiny)."""
        rows = [self.runner.run_prefill(row[None])[0] for row in ids.cpu().numpy()]
        return torch.from_numpy(np.ascontiguousarray(np.concatenate(rows), dtype=np.float32))

    def facts(self, name: str) -> dict:
        """What `model_facts` says of a model, for the export: its size is its files' bytes on disk."""
        on_disk = sum(export_files(self.directory).values())
        weights = self.source.get("weights")
        return {"name": name, "family": self.source.get("family"), "form": self.source.get("form"),
                "runtime": "onnxruntime", "parameters": weights, "size_mb": on_disk / 1e6,
                "bits_per_weight": 8 * on_disk / weights if weights else None,
                "quantization": self.source.get("quantization")}


def model_facts(model, name: str) -> dict:
    if isinstance(model, ExportLogits):
        return model.facts(name)
    size = weight_bits(model, saved_float_dtype(model))  # as its model directory stores it
    return {"name": name, "family": model.config.family, "form": model.form, "parameters": size["weights"],
            "size_mb": size["size_mb"], "bits_per_weight": size["bits_per_weight"],
            "quantization": model.config.quantization, "state_bytes": model.decode_state_bytes()}


def save_reference(path, logits: torch.Tensor, windows: torch.Tensor, report: dict, force: bool = False) -> None:
    """Reference logits for later comparisons: safetensors with the token windows and, as metadata,
    the text's fingerprint and the model that made them. Written atomically."""
    meta = {"edgettt_reference_logits": "1", "text": json.dumps(report["text"]), "model": json.dumps(report["model"]),
            "ctx": str(report["ctx"])}
    with as_output(path, "logits", force).write() as tmp:
        save_safetensors({"logits": logits.float(), "windows": windows}, tmp, metadata=meta)


def load_reference(path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(logits [N, T, V], windows [N, T+1], metadata) of a file written by `save_reference`."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            logits, windows = f.get_tensor("logits"), f.get_tensor("windows")
        meta = {k: json.loads(meta[k]) for k in ("text", "model", "ctx")}
    except FileNotFoundError:
        raise EdgetttError(f"{path}: no such file; save reference logits first with `edgettt eval --save-logits`") from None
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise EdgetttError(f"{path}: not a reference-logits file written by edgettt eval ({exc}); save them with "
                           "`edgettt eval --save-logits`") from None
    check_reference(path, logits, windows)
    return logits, windows, meta


def check_reference(path, logits: torch.Tensor, windows: torch.Tensor) -> None:
    """Saved logits [N, T, V] (float) and their windows [N, T + 1] of token ids below V, as `save_reference` writes
    them: anything else is refused before it is used."""
    shaped = (logits.dim() == 3 and windows.dim() == 2 and logits.is_floating_point()
              and windows.dtype == torch.int64 and tuple(windows.shape) == (logits.shape[0], logits.shape[1] + 1))
    if not shaped or windows.numel() == 0 or not 0 <= int(windows.min()) <= int(windows.max()) < logits.shape[-1]:
        raise EdgetttError(f"{path}: its logits {list(logits.shape)} and token windows {list(windows.shape)} "
                           f"({windows.dtype}) do not fit together; save reference logits again with "
                           "`edgettt eval --save-logits`")


def vocab_size(model: LanguageModel | ExportLogits) -> int:
    return model.vocab_size if isinstance(model, ExportLogits) else model.config.vocab_size


def check_comparable(model, name: str, ref, ref_name: str, text: Text) -> None:
    """Before any logits are computed: the reference has the model's vocabulary and reads the text as the same
    tokens (a drift between two tokenizations would measure nothing)."""
    if vocab_size(ref) != vocab_size(model):
        raise EdgetttError(f"{ref_name}: a vocabulary of {vocab_size(ref)}, {name} has {vocab_size(model)}; give the "
                           "model it was converted or quantized from as the reference")
    sample = Text(text.name, text.data[:4096])
    if encode(ref, sample, ref_name) != encode(model, sample, name):
        raise EdgetttError(f"{ref_name}: its tokenizer reads {text.name} as other tokens than {name}'s; give the "
                           "model it was converted or quantized from as the reference")


def evaluate(model: LanguageModel | ExportLogits, name: str, text: Text, ctx: int, max_tokens: int | None,
             ref: LanguageModel | None = None, ref_name: str | None = None, ref_file=None) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Perplexity and bits per byte of `model`; with a reference model or saved reference logits,
    the drift against it. Returns (report, logits, windows)."""
    ref_logits, ref_facts = None, None
    if ref_file is not None:
        ref_logits, windows, meta = load_reference(ref_file)
        if meta["text"]["sha256"] != text.fingerprint()["sha256"]:
            raise EdgetttError(f"{ref_file}: reference logits were made on {meta['text']['name']} "
                               f"(sha256 {meta['text']['sha256']}), not on {text.name}; pass the same --data")
        vocab = vocab_size(model)
        if ref_logits.shape[-1] != vocab:
            raise EdgetttError(f"{ref_file}: reference vocabulary {ref_logits.shape[-1]} differs from the model's "
                               f"{vocab}")
        ref_facts = meta["model"]
    else:
        windows = token_windows(encode(model, text, name), ctx, max_tokens)
    if ref is not None:
        check_comparable(model, name, ref, ref_name, text)
    logits = collect_logits(model, windows, desc=name)
    if ref is not None:
        ref_logits, ref_facts = collect_logits(ref, windows, desc=ref_name), model_facts(ref, ref_name)
    n_bytes = target_bytes(model, windows)
    report = {"model": model_facts(model, name), "text": text.fingerprint(), "ctx": windows.shape[1] - 1,
              "windows": windows.shape[0], **metrics.perplexity(logits, windows[:, 1:], n_bytes)}
    if ref_logits is not None:
        report["ref_model"] = ref_facts
        report["drift"] = metrics.drift(ref_logits, logits, windows[:, 1:], n_bytes=n_bytes)
    return report, logits, windows
