"""The linear-attention form of a TTT layer (DESIGN section 4), in plain torch.

A level of fast weights is a linear attention with queries `qa = [q, 1]`, keys `ka = [k, 1]`,
values `vh` and a chunk-structured causal mask: inside a mini-batch token i weighs every earlier
token of its mini-batch by `eta_tok[i]`; every token of an earlier mini-batch weighs `eta_tok[b]`.
The state is the pair (S, A): S the boundary state, A the sum of `ka^T vh` inside the current
mini-batch. Three computations share one signature (as in flash-linear-attention):

    fn(qa, ka, vh, S, A, eta_tok, start, requant=None, decay=None) -> (Zbar, S, A)
    qa, ka: [B, H, T, Dk]   vh: [B, H, T, Dv]   S, A: [B, H, Dk, Dv]   eta_tok: [b]
    start: position of the first token (`recurrent` also takes a 0-d tensor); start % b places the
           tokens in their mini-batches, the absolute position only matters to `requant`
    requant: optional (S, position) -> S applied at every mini-batch commit, position = the tokens
             seen when it commits (a quantized state: S is rounded T/b times, while A keeps full
             precision inside the mini-batch; its scales may depend on the position)
    decay: optional `Decay` (a decayed parallel form): at every commit S -> S0 + gamma (S - S0) before
           the mini-batch's sum is added, so what the state has learned fades by gamma a mini-batch

- `naive`: the whole-sequence matrix form `Qa S + ((Qa Ka^T) * M) Vh`, for tests;
- `chunk`: parallel inside each mini-batch and across mini-batches (prefix sums of chunk states);
- `recurrent`: one token at a time, the decode step;
- `recurrent_summed`: one token whose products are written as element-wise products and sums, which
  torch.compile fuses with what makes and reads them (the compiled decode step `edgettt.prepare` sets up);
- `open_token`: likewise, with the open mini-batch kept as its keys and values.
The Triton kernels that compute these faster (`ops.linear_attention.prefill`, `ops.linear_attention.decode`, `ops.linear_attention.commits`) are
chosen by `edgettt.prepare`, never here.

The value maps (`linear_values`, `mlp_values`) turn (k, v, lr) into effective values at a given
state: the closed-form LN-L2 gradient, negated and scaled by the learning rate.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch._higher_order_ops.scan import scan

from edgettt.ops import exporting, gelu_tanh, gelu_tanh_grad, ln_l2_grad


def augment(x: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [..., D+1] with a constant 1 feature (the bias row of the state)."""
    return F.pad(x, (0, 1), value=1.0)  # one Pad node in an exported graph


def summed_times(q: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """q @ S for one token ([..., 1, Dk] @ [..., Dk, Dv]) as a product and a sum over Dk: a reduction that
    inductor fuses with what makes q and reads the result, where a matmul is a cuBLAS GEMV of its own."""
    return (q.transpose(-1, -2) * S).sum(-2, keepdim=True)


class Decay(NamedTuple):
    """A decayed form's forgetting at each mini-batch commit, per head: S -> S0 + gamma (S - S0), then
    S + eta_last U as always. gamma [H] in (0, 1]; S0 [H, Dk, Dv], the state it decays towards (the
    layer's initial state: an undamped parallel form's state grows with the text, DESIGN section 4)."""
    gamma: torch.Tensor
    S0: torch.Tensor

    def __call__(self, S: torch.Tensor) -> torch.Tensor:
        """One commit's decay of S [B, H, Dk, Dv]."""
        return self.S0 + self.gamma[:, None, None] * (S - self.S0)

    def weights(self, N: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """For N commits in a row: lags [H, N, N] (gamma^(n - m) for m <= n, else 0: what commit m's sum
        weighs in the state after commit n) and carries [H, N] (gamma^(n + 1): what the starting state's
        S - S0 weighs after commit n)."""
        n = torch.arange(N, device=device, dtype=self.gamma.dtype)
        log_gamma = torch.log(self.gamma.clamp_min(1e-30))[:, None, None]  # (a gamma of 0: no 0 * -inf)
        lag = n[:, None] - n[None, :]
        lags = torch.where(lag >= 0, torch.exp(log_gamma * lag.clamp(min=0)), torch.zeros_like(lag))
        return lags, torch.exp(log_gamma[:, :, 0] * (n + 1))


def chunk_index(start: int, length: int, block: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: its mini-batch number (counted from the first token's) and index inside it."""
    pos = torch.arange(start, start + length, device=device)
    return pos // block - start // block, pos % block


def naive(qa, ka, vh, S, A, eta_tok, start, requant=None, decay=None):
    assert requant is None and decay is None, "the whole-sequence form has no mini-batch commits to round or decay at"
    T, b = qa.shape[2], eta_tok.shape[0]
    chunk, inner = chunk_index(start, T, b, qa.device)
    same = chunk[:, None] == chunk[None, :]
    causal = torch.arange(T, device=qa.device)[:, None] >= torch.arange(T, device=qa.device)[None, :]
    row_eta = eta_tok[inner]  # [T]
    mask = torch.where(same, row_eta[:, None], eta_tok[-1]) * causal  # [T, T]
    # A (the unfinished mini-batch before `start`) is weighed like a token of the first mini-batch
    prev_eta = torch.where(chunk == 0, row_eta, eta_tok[-1])[:, None]
    zbar = qa @ S + ((qa @ ka.transpose(-1, -2)) * mask) @ vh + prev_eta * (qa @ A)
    # final state: every finished mini-batch is committed to S, the unfinished one stays in A
    finished_last = bool(inner[-1] == b - 1)
    done = ((chunk < chunk[-1]) | finished_last).to(qa.dtype)[:, None]  # [T, 1]
    prev_done = float(finished_last or bool(chunk[-1] > 0))
    kt = ka.transpose(-1, -2)
    S_new = S + eta_tok[-1] * (kt @ (vh * done) + prev_done * A)
    A_new = kt @ (vh * (1 - done)) + (1 - prev_done) * A
    return zbar, S_new, A_new


def chunk(qa, ka, vh, S, A, eta_tok, start, requant=None, decay=None, states=None):
    """`states`: what computes the chain of commits (`committed_states`, or a kernel with its signature)."""
    B, H, T, Dk = qa.shape
    b = eta_tok.shape[0]
    front = start % b
    back = (-(front + T)) % b
    # pad so that every chunk is a whole mini-batch; padded keys/values are zero and add nothing
    qa_, ka_, vh_ = (F.pad(x, (0, 0, front, back)) for x in (qa, ka, vh))
    N = (front + T + back) // b
    qa_, ka_, vh_ = (x.reshape(B, H, N, b, x.shape[-1]) for x in (qa_, ka_, vh_))
    U = ka_.transpose(-1, -2) @ vh_  # [B, H, N, Dk, Dv]: each mini-batch's sum of ka^T vh
    U = torch.cat((U[:, :, :1] + A[:, :, None], U[:, :, 1:]), dim=2)  # the unfinished sum joins chunk 0
    ends = start - front + b * torch.arange(1, N + 1, device=U.device)  # position of each chunk's commit
    S_after = (states or committed_states)(S, U, eta_tok[-1], requant, ends, decay)  # [B, H, N, Dk, Dv]: after each chunk
    S_chunks = torch.cat((S[:, :, None], S_after[:, :, :-1]), dim=2)  # boundary state of each chunk
    scores = torch.tril(qa_ @ ka_.transpose(-1, -2))  # [B, H, N, b, b]
    zbar = qa_ @ S_chunks + eta_tok[:, None] * (scores @ vh_)
    # A's readout by the first chunk's tokens (the later chunks see it through S_chunks)
    zbar[:, :, 0] += eta_tok[:, None] * (qa_[:, :, 0] @ A)
    zbar = zbar.reshape(B, H, N * b, -1)[:, :, front:front + T]
    # when the last mini-batch is complete everything is committed, else its sum stays in A; chosen
    # with a tensor, not a Python branch, so that an exported graph keeps both cases
    real = F.pad(qa.new_ones(T), (front, back))
    complete = real[-1] > 0
    return (zbar, torch.where(complete, S_after[:, :, -1], S_chunks[:, :, -1]),
            torch.where(complete, torch.zeros_like(A), U[:, :, -1]))


def committed_states(S, U, eta_last, requant=None, ends=None, decay=None):
    """S after each mini-batch n: S + eta_last * (U_0 + ... + U_n), a prefix sum; with `decay`, the
    decayed sum S0 + gamma^(n+1) (S - S0) + eta_last sum_m gamma^(n-m) U_m (one product with the lag
    weights); with `requant`, a loop that rounds S at every commit (`ends` [N]: the position of each
    commit): in an exported graph one Scan."""
    if requant is None and decay is None:
        return S[:, :, None] + eta_last * torch.cumsum(U, dim=2)
    if requant is None:
        B, H, N, Dk, Dv = U.shape
        lags, carries = decay.weights(N, U.device)
        summed = (lags.to(U.dtype) @ U.reshape(B, H, N, Dk * Dv)).reshape(B, H, N, Dk, Dv)
        S0 = decay.S0[None, :, None]
        return S0 + carries.to(U.dtype)[None, :, :, None, None] * (S[:, :, None] - S0) + eta_last * summed
    if exporting():  # a graph of any length: the loop becomes one ONNX Scan

        if decay is not None:  # its S0 is also the int12 format's offset: a Scan's inputs may not alias
            decay = Decay(decay.gamma, decay.S0.clone())

        def commit(S, xs):
            U_n, end = xs
            S = requant(_decayed(S, decay) + eta_last * U_n, end.reshape(()))
            return S, S.clone()

        # both inputs scanned along dim 2: the positions as [1, 1, N]
        return scan(commit, S, (U, ends.reshape(1, 1, -1)), dim=2)[1]  # [B, H, N, Dk, Dv], stacked along dim 2
    out = []
    for n in range(U.shape[2]):
        S = requant(_decayed(S, decay) + eta_last * U[:, :, n], int(ends[n]))
        out.append(S)
    return torch.stack(out, dim=2)


def _decayed(S, decay):
    """S as a commit leaves it before adding the mini-batch's sum: decayed towards S0, or as it is."""
    return S if decay is None else decay(S)


def states_by_position(ka, vh, S, A, eta_tok, start, decay=None):
    """The state every token reads: (boundary S, running A including the token), each
    [B, H, T, Dk, Dv]. For calibration statistics; memory grows with T * Dk * Dv."""
    B, H, T, Dk = ka.shape
    b = eta_tok.shape[0]
    front, back = start % b, (-(start % b + T)) % b
    outer = F.pad(ka[..., :, None] * vh[..., None, :], (0, 0, 0, 0, front, back))
    N = outer.shape[2] // b
    A_pos = torch.cumsum(outer.reshape(B, H, N, b, Dk, -1), dim=3)
    A_pos[:, :, 0] += A[:, :, None]
    S_after = committed_states(S, A_pos[:, :, :, -1], eta_tok[-1], decay=decay)
    S_chunks = torch.cat((S[:, :, None], S_after[:, :, :-1]), dim=2)
    S_pos = S_chunks[:, :, :, None].expand(-1, -1, -1, b, -1, -1)
    flat = lambda x: x.reshape(B, H, N * b, Dk, -1)[:, :, front:front + T]  # noqa: E731
    return flat(S_pos), flat(A_pos)


def recurrent(qa, ka, vh, S, A, eta_tok, start, requant=None, decay=None):
    b = eta_tok.shape[0]
    outputs = []
    T = qa.shape[2]
    for t in range(T):
        inner = (start + t) % b
        q_t, k_t, v_t = (x if T == 1 else x[:, :, t:t + 1] for x in (qa, ka, vh))  # [B, H, 1, D]
        A = A + k_t.transpose(-1, -2) @ v_t  # the outer product ka^T vh
        # q (S + eta A) without the sum of two states: in a decode graph each state-sized op costs
        # as much as a small matmul
        outputs.append(q_t @ S + eta_tok[inner] * (q_t @ A))
        if torch.is_tensor(inner):  # a position given as a tensor (exported graph): no branch
            commit = (inner == b - 1).to(A.dtype)  # 1 at the mini-batch's last token, else 0
            if requant is None and decay is None:  # S + 0 * A is S, A * 1 is A: a select in fewer, lighter nodes
                S, A = S + (commit * eta_tok[-1]) * A, A * (1 - commit)
            else:
                S_next = _decayed(S, decay) + eta_tok[-1] * A
                S_next = S_next if requant is None else requant(S_next, start + t + 1)
                S, A = torch.where(commit > 0, S_next, S), A * (1 - commit)
        elif inner == b - 1:  # end of a mini-batch: commit
            S, A = _commit(S, A, eta_tok, requant, start + t + 1, decay)
    return torch.cat(outputs, dim=2), S, A


def _commit(S, A, eta_tok, requant, position: int, decay):
    """The state after a mini-batch's last token at `position` (tokens seen): (S, A) -> (S', 0)."""
    S = _decayed(S, decay) + eta_tok[-1] * A
    return (S if requant is None else requant(S, position)), torch.zeros_like(A)


def recurrent_summed(qa, ka, vh, S, A, eta_tok, start: int, requant=None, decay=None):
    """`recurrent` for one token at an int position, the update and the read as one reduction over the
    state each (`summed_times`): what a compiled decode step takes."""
    inner = start % eta_tok.shape[0]
    A = A + ka.transpose(-1, -2) * vh
    zbar = summed_times(qa, S + eta_tok[inner] * A)
    if inner == eta_tok.shape[0] - 1:  # end of a mini-batch: commit
        S, A = _commit(S, A, eta_tok, requant, start + 1, decay)
    return zbar, S, A


def open_token(qa, K, V, filled, S, eta_tok, inner: int, requant=None, position: int = 0, decay=None):
    """`recurrent` for one token whose running sum A = K^T diag(filled) V is kept as the open
    mini-batch's keys K [B, H, b, Dk] and values V [B, H, b, Dv] (the token's own in its slot `inner`,
    `filled` [b] 1 for slots 0..inner). Returns (Zbar [B, H, 1, Dv], S).

    q (S + eta A) is read as q S + eta sum_i (q . K_i) V_i: A (Dk Dv values a head) is never formed,
    only b dot products; at the mini-batch's last token S + eta_last A is committed (after `decay`,
    then `requant` at `position`, the tokens seen after this one)."""
    scores = (qa * K).sum(-1, keepdim=True) * filled[:, None]  # [B, H, b, 1]
    zbar = summed_times(qa, S) + eta_tok[inner] * (scores * V).sum(-2, keepdim=True)
    if inner == eta_tok.shape[0] - 1:  # end of a mini-batch: commit (every slot filled)
        S = _decayed(S, decay) + eta_tok[-1] * (K[..., :, None] * V[..., None, :]).sum(-3)
        if requant is not None:
            S = requant(S, position)
    return zbar, S


def linear_values(ka, k, v, lr, S, gamma, beta, times=torch.matmul):
    """TTT-Linear effective values `vh = -lr * dloss/dZ` at state S.

    ka: [B, H, T, d+1]; k, v: [B, H, T, d]; lr: [B, H, T]; S: [B, H, d+1, d] or [H, d+1, d];
    gamma, beta: [H, 1, d]; `times`: the product ka @ S (`summed_times` for one compiled token).
    """
    g = ln_l2_grad(times(ka, S), v - k, gamma, beta)
    return -lr[..., None] * g


def mlp_values(ka, k, v, lr, S1, S2, gamma, beta):
    """TTT-MLP effective values of both levels at state (S1, S2), and the level-2 keys [X2, 1].

    S1: [.., d+1, 4d]; S2: [.., 4d+1, d]. Returns (vh1 [B,H,T,4d], vh2 [B,H,T,d], ka2 [B,H,T,4d+1]).
    """
    z1 = ka @ S1
    ka2 = augment(gelu_tanh(z1))
    g2 = ln_l2_grad(ka2 @ S2, v - k, gamma, beta)
    g1 = (g2 @ S2[..., :-1, :].transpose(-1, -2)) * gelu_tanh_grad(z1)
    return -lr[..., None] * g1, -lr[..., None] * g2, ka2


FORMS = {"naive": naive, "chunk": chunk, "recurrent": recurrent}
