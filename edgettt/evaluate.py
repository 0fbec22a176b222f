"""Running models over sample text, and the conversion report that `convert` prints and writes."""

from __future__ import annotations

import torch
from tqdm import tqdm

from . import metrics
from .data import Text, token_windows
from .errors import EdgetttError
from .model import CausalLM


def encode(model: CausalLM, text: Text, source: str = "model") -> list[int]:
    if model.tokenizer is None:
        raise EdgetttError(
            f"{source}: vocabulary of {model.config.vocab_size} is too small for byte-level text and the "
            "directory has no tokenizer.json; add one, or skip the measurement (--no-report)"
        )
    return model.tokenizer.encode_bytes(text.data)


@torch.no_grad()
def collect_logits(model: CausalLM, windows: torch.Tensor, batch_size: int = 8, desc: str = "") -> torch.Tensor:
    """Logits [N, T, V] of every window's inputs (all but its last token)."""
    device = best_device()
    model.to(device)
    out = []
    for i in tqdm(range(0, windows.shape[0], batch_size), desc=desc, leave=False, disable=None):
        out.append(model(windows[i:i + batch_size, :-1].to(device)).float().cpu())
    return torch.cat(out)


def best_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def target_bytes(model: CausalLM, windows: torch.Tensor) -> int:
    return sum(len(model.tokenizer.decode(row.tolist()).encode("utf-8")) for row in windows[:, 1:])


def conversion_report(original: CausalLM, converted: CausalLM, text: Text, ctx: int,
                      max_tokens: int | None) -> dict:
    """Exact form: logit error against the original. Parallel form: the drift it causes."""
    windows = token_windows(encode(original, text), ctx, max_tokens)
    ref = collect_logits(original, windows, desc=f"{original.form} model")
    new = collect_logits(converted, windows, desc=f"{converted.form} form")
    report = {
        "form": converted.form,
        "source_form": original.form,
        "text": text.fingerprint(),
        "ctx": windows.shape[1] - 1,
        "windows": windows.shape[0],
        **metrics.logit_error(ref, new),
    }
    if converted.form == "parallel":
        report.update(metrics.drift(ref, new, windows[:, 1:], n_bytes=target_bytes(original, windows)))
    return report
