"""GPTQ (Frantar et al., 2022): round a weight matrix column by column, spreading each column's
rounding error over the columns not yet rounded, weighted by the inverse Hessian of the layer's
inputs (`H = X^T X / n`, from `edgettt calibrate`). The grid is the format's: it passes
`round_column` (see `weight_formats.py`: int8 and int4 use it).
"""

from __future__ import annotations

import torch


def gptq(w: torch.Tensor, hessian: torch.Tensor, round_column, damp: float = 0.01, block: int = 128) -> None:
    """Columns are rounded in order, and each one's rounding error is spread over the columns not
    yet rounded, weighted by the inverse Hessian of the layer's inputs.

    `round_column(col, column, ahead)` returns column `col` (its error-updated values `column`, [N])
    rounded and dequantized; `ahead()` gives the error-updated weights from `col` on ([N, K - col]),
    for formats that choose their grid late."""
    w = w.clone().float()
    N, K = w.shape
    H = hessian.clone().double()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    w[:, dead] = 0
    H += damp * torch.diag(H).mean() * torch.eye(K, dtype=H.dtype)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True).float()
    for b0 in range(0, K, block):
        b1 = min(b0 + block, K)
        W1, Err = w[:, b0:b1].clone(), torch.zeros(N, b1 - b0)
        for i in range(b1 - b0):
            col = b0 + i
            rounded = round_column(col, W1[:, i], lambda: torch.cat((W1[:, i:], w[:, b1:]), dim=1))
            err = (W1[:, i] - rounded) / Hinv[col, col]
            W1[:, i:] -= err[:, None] * Hinv[col, col:b1][None, :]
            Err[:, i] = err
        w[:, b1:] -= Err @ Hinv[b0:b1, b1:]
