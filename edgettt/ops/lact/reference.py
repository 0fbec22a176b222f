"""Plain-torch references of the LaCT W1-only parallel form's operations and of its decode step (the
signatures in `triton.py`, whose kernels compute the same), and the low-rank initial weights `LowRank`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32 at least: the references compute in float32, and in float64 when given it (the export's
    check against float64 runs them so)."""
    return x if x.dtype == torch.float64 else x.float()


@dataclass
class LowRank:
    """A fast weight W = left @ right + IDENTITY * I (the rectangular identity), [H, rows, cols]: LaCT's
    low-rank initial W0 and W2 (`w0_w2_low_rank`), kept as factors. left [H, rows, r], right [H, r, cols]."""

    left: torch.Tensor
    right: torch.Tensor
    IDENTITY = 0.5

    def dense(self) -> torch.Tensor:
        W = self.left @ self.right
        rows, cols = W.shape[-2:]
        return W + self.IDENTITY * torch.eye(rows, cols, dtype=W.dtype, device=W.device)

    def to(self, dtype) -> LowRank:
        return LowRank(self.left.to(dtype), self.right.to(dtype))

    @property
    def requires_grad(self) -> bool:
        return self.left.requires_grad or self.right.requires_grad

    @property
    def nbytes(self) -> int:
        return self.left.nbytes + self.right.nbytes


def project_ref(xf, w):
    """x W^T for a dense W or a `LowRank` one (float32)."""
    if not isinstance(w, LowRank):
        return xf @ wide(w).transpose(-1, -2)
    rows, cols = w.left.shape[-2], xf.shape[-1]
    own = xf[..., :rows] if rows <= cols else F.pad(xf, (0, rows - cols))  # x I^T (rows beyond cols: 0)
    return (xf @ wide(w.right).transpose(-1, -2)) @ wide(w.left).transpose(-1, -2) + LowRank.IDENTITY * own


def features_ref(x, w0, w2, rate=None):
    xf = wide(x)
    phi = F.silu(project_ref(xf, w0)) * project_ref(xf, w2)
    return (phi if rate is None else phi * wide(rate)).to(x.dtype)


def momentum_coefficients(m: torch.Tensor):
    """E [.., i, n] = prod_{l=i+1}^{n} m_l for n >= i (else 0), P [.., n] = prod_{l=0}^{n} m_l, from the
    chunks' momentum coefficients m [.., N] (in (0, 1): LaCT's mean sigmoid gates)."""
    N = m.shape[-1]
    logs = torch.cumsum(torch.log(m), dim=-1)  # Lambda_n = sum_{l<=n} log m_l
    upper = torch.triu(torch.ones(N, N, dtype=torch.bool, device=m.device))  # n >= i
    E = torch.where(upper, torch.exp((logs[..., None, :] - logs[..., :, None]).clamp(max=0)), 0.0)
    return E, torch.exp(logs)


def chunk_momenta_ref(gates, gate_in, chunk: int, front: int = 0):
    B, H, T = gates.shape
    N = chunk_count(front, T, chunk)
    G = padded_chunks(wide(gates), front, N, chunk).sum(-1)
    G = torch.cat((G[:, :, :1] + gate_in[:, :, None], G[:, :, 1:]), dim=2)
    return G / chunk, G[:, :, -1]


def chunk_count(front: int, T: int, chunk: int) -> int:
    """Chunks that `front` empty slots and T tokens touch. Only positive operands: an exported graph
    (torch.onnx, dynamo) turns a floor division of a negative length into ONNX's truncating Div,
    which made -(-T // chunk) one chunk short."""
    return (front + T + chunk - 1) // chunk


def padded_chunks(x, front: int, N: int, chunk: int):
    """[B, H, T, ...] -> [B, H, N, chunk, ...]: `front` zeros first, zeros after the last token."""
    x = F.pad(x, [0, 0] * (x.dim() - 3) + [front, N * chunk - front - x.shape[2]])
    return x.reshape(*x.shape[:2], N, chunk, *x.shape[3:])


def chunk_attention_ref(phi_q, keys, v, w1, u0, d_in, m, chunk: int, front: int = 0):
    """Every chunk at once, no loop (an exported graph keeps this form): the momentum recurrence
    unrolled into the coefficients E, P (`momentum_coefficients`)."""
    B, H, T, _ = phi_q.shape
    N = chunk_count(front, T, chunk)
    U = padded_chunks(wide(v), front, N, chunk).transpose(-1, -2) @ padded_chunks(wide(keys), front, N, chunk)
    U = torch.cat((U[:, :, :1] + u0[:, :, None], U[:, :, 1:]), dim=2)  # [B, H, N, dv, dh]
    if m is None:
        D, d_in = U, torch.zeros_like(w1)
    else:
        E, P = momentum_coefficients(m)
        D = torch.einsum("bhin,bhixy->bhnxy", E, U) + P[..., None, None] * d_in[:, :, None]
    W = w1[:, :, None] + (torch.cumsum(D, dim=2) - D)  # W_c: what chunk c's tokens read
    out = padded_chunks(wide(phi_q), front, N, chunk) @ W.transpose(-1, -2)
    out = out.reshape(B, H, N * chunk, -1)[:, :, front:front + T].to(v.dtype)
    d_prev = torch.cat((d_in[:, :, None], D), dim=2)[:, :, -2]
    ends = {"w": W[:, :, -1] + D[:, :, -1], "w_open": W[:, :, -1], "u": U[:, :, -1], "d": D[:, :, -1],
            "d_prev": d_prev}
    return out, ends


def decode_step_ref(phi_q, key, v, w1, g1, d, m, commit: bool):
    out = (w1 @ wide(phi_q)[..., None])[..., 0].to(v.dtype)
    g1 += wide(v)[..., :, None] * wide(key)[..., None, :]
    if commit:
        D = g1 if m is None else g1 + m[..., None, None] * d
        if d is not None:
            d.copy_(D)
        w1 += D
        g1.zero_()
    return out


