"""Accuracy drift between a model and a reference, in llama.cpp's perplexity-tool conventions (DESIGN 7).

All functions take logits [N, T, V] (N windows of T positions) and targets [N, T] (the next token
of each position); position t of every window is counted in position bucket t * buckets // T.
"""

from __future__ import annotations

import math

import torch


def nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood (nats) of each target: [N, T]."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return -logp.gather(-1, targets[..., None])[..., 0]


def perplexity(logits: torch.Tensor, targets: torch.Tensor, n_bytes: int | None = None) -> dict:
    return _perplexity_of(nll(logits, targets), n_bytes)


def kld(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(ref || model) of the next-token distribution at every position: [...] (the last dim is V)."""
    ref_logp = torch.log_softmax(ref_logits.double(), dim=-1)
    logp = torch.log_softmax(logits.double(), dim=-1)
    return (ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp_min(0)


def token_stats(ref_logits: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """What `drift` and `logit_error` read of each position, [N, T] each: computed a batch of windows at a
    time and concatenated along N, they give the same numbers as the whole logits at once, in a fraction of
    the memory (the logits of one batch, not of the text)."""
    ref_logp = torch.log_softmax(ref_logits.double(), dim=-1)
    logp = torch.log_softmax(logits.double(), dim=-1)
    ref_top = ref_logp.argmax(-1)
    diff = logits.double() - ref_logits.double()
    return {
        "kld": (ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp_min(0),
        "top1": (logp.argmax(-1) == ref_top).double(),
        "dp": logp.gather(-1, ref_top[..., None])[..., 0].exp() - ref_logp.gather(-1, ref_top[..., None])[..., 0].exp(),
        "ref_nll": -ref_logp.gather(-1, targets[..., None])[..., 0],
        "nll": -logp.gather(-1, targets[..., None])[..., 0],
        "diff_sq": diff.pow(2).sum(-1), "ref_sq": ref_logits.double().pow(2).sum(-1),
        "max_abs": diff.abs().amax(-1),
    }


def concat_stats(parts: list[dict[str, torch.Tensor]], dim: int = 0) -> dict[str, torch.Tensor]:
    """`token_stats` of consecutive batches of windows (dim 0) or spans of positions (dim 1) as one."""
    return {key: torch.cat([p[key] for p in parts], dim=dim) for key in parts[0]}


def _perplexity_of(losses: torch.Tensor, n_bytes: int | None) -> dict:
    mean = losses.mean().item()
    out = {"ppl": math.exp(mean), "nll": mean, "tokens": losses.numel()}
    if n_bytes:
        out["bits_per_byte"] = losses.sum().item() / math.log(2) / n_bytes
    return out


def drift(ref_logits: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor,
          n_bytes: int | None = None, buckets: int = 8) -> dict:
    """Perplexity of both, KL(ref || model) statistics, top-1 agreement, RMS dp, KLD by position."""
    return drift_of(token_stats(ref_logits, logits, targets), n_bytes, buckets)


def drift_of(stats: dict[str, torch.Tensor], n_bytes: int | None = None, buckets: int = 8) -> dict:
    """`drift` from the per-position numbers `token_stats` gives."""
    per_token = stats["kld"]
    flat = per_token.flatten()
    q = torch.quantile(flat, torch.tensor([0.5, 0.9, 0.99, 0.999], dtype=flat.dtype)).tolist()
    stderr = flat.std().item() / math.sqrt(flat.numel()) if flat.numel() > 1 else 0.0
    ref, test = _perplexity_of(stats["ref_nll"], n_bytes), _perplexity_of(stats["nll"], n_bytes)
    T = per_token.shape[1]
    bucket_of = torch.arange(T) * buckets // T
    by_position = [per_token[:, bucket_of == i].mean().item() for i in range(min(buckets, T))]
    return {
        "ref": ref,
        "model": test,
        "ppl_ratio": test["ppl"] / ref["ppl"],
        "ppl_diff": test["ppl"] - ref["ppl"],
        "kld_mean": flat.mean().item(),
        "kld_stderr": stderr,
        "kld_median": q[0],
        "kld_p90": q[1],
        "kld_p99": q[2],
        "kld_p999": q[3],
        "kld_max": flat.max().item(),
        "top1": stats["top1"].mean().item(),
        "rms_dp": stats["dp"].pow(2).mean().sqrt().item(),
        "kld_by_position": by_position,
    }


def logit_error_of(stats: dict[str, torch.Tensor]) -> dict:
    """`logit_error` from the per-position numbers `token_stats` gives."""
    return {"max_abs_error": stats["max_abs"].max().item(),
            "rel_error": (stats["diff_sq"].sum().sqrt() / stats["ref_sq"].sum().sqrt()).item()}


def logit_error(ref_logits: torch.Tensor, logits: torch.Tensor) -> dict:
    """Max absolute error and relative error (Frobenius norms) of logits."""
    diff = (logits.double() - ref_logits.double())
    return {
        "max_abs_error": diff.abs().max().item(),
        "rel_error": (diff.norm() / ref_logits.double().norm()).item(),
    }
