"""The original TTT-Linear / TTT-MLP layer, following DESIGN 3.4 line by line (the reference).

The fast weights (W, b) are trained by one gradient step per mini-batch of b tokens, every gradient
taken at the mini-batch's boundary state. Inside a mini-batch the dual form is used: token i reads
`q_i W + b - eta_tok[i] * sum_{j<=i} lr_j (q_i . k_j + 1) g_j`. The running sums
`GW = sum lr_j k_j^T g_j` and `Gb = sum lr_j g_j` carry an unfinished mini-batch from one call to
the next, so prefill can stop anywhere and decode (one token per call) continues exactly.

Parameter names and shapes are those of the ttt-lm-pytorch checkpoints (DESIGN 3.2). The exact-form
kernel with a backward that `edgettt.prepare` gives TTT-Linear is in `fast_paths.layers`.
"""

from __future__ import annotations

import torch
from torch import nn

from edgettt.families.ttt.config import ModelConfig
from edgettt.formats.state_roles import CONV, FAST_WEIGHTS, GRADIENT_SUMS, StateRole
from edgettt.families.ttt.mixer import MixerBase, zeros_state
from edgettt.ops import gelu_tanh, gelu_tanh_grad, layer_norm, ln_l2_grad, mini_batch_etas, segments


class TTTLayer(MixerBase):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        H, d, C, b = self.num_heads, self.head_dim, config.hidden_size, config.mini_batch_size
        self.learnable_token_idx = nn.Parameter(torch.zeros(b))
        self.learnable_ttt_lr_weight = nn.Parameter(torch.normal(0, 0.02, size=(H, 1, C)))
        self.learnable_ttt_lr_bias = nn.Parameter(torch.zeros(H, 1))
        self.ttt_norm_weight = nn.Parameter(torch.ones(H, d))
        self.ttt_norm_bias = nn.Parameter(torch.zeros(H, d))
        self.mlp = config.ttt_layer_type == "mlp"
        inner = config.inner_dim
        self.W1 = nn.Parameter(torch.normal(0, 0.02, size=(H, d, inner)))
        self.b1 = nn.Parameter(torch.zeros(H, 1, inner))
        if self.mlp:
            self.W2 = nn.Parameter(torch.normal(0, 0.02, size=(H, inner, d)))
            self.b2 = nn.Parameter(torch.zeros(H, 1, d))

    def fast_weight_names(self) -> list[str]:
        return ["W1", "b1", "W2", "b2"] if self.mlp else ["W1", "b1"]

    def state_roles(self) -> dict[str, StateRole]:
        roles = {name: StateRole(CONV) for name in self.conv_state_shapes()}
        for name in self.fast_weight_names():  # W1, b1 (W2, b2): level 1 (2)
            level = int(name[1:])
            roles[name], roles["G" + name] = StateRole(FAST_WEIGHTS, level), StateRole(GRADIENT_SUMS, level)
        return roles

    def init_state(self, batch_size: int) -> dict:
        state = zeros_state(self.conv_state_shapes(), batch_size, self.W1)
        for name in self.fast_weight_names():
            # not detached: the initial fast weights are parameters the outer loop trains (as in
            # ttt-lm-pytorch); under no_grad this is the same copy
            state[name] = getattr(self, name).unsqueeze(0).repeat(batch_size, 1, 1, 1)
            state["G" + name] = torch.zeros_like(state[name])  # running gradient sums
        return state

    def commit_weight(self) -> float:
        """eta_tok of a mini-batch's last token: what a mini-batch adds to the state with (0: never commits)."""
        return float(mini_batch_etas(self.learnable_token_idx.detach())[-1])

    def learning_rates(self, x: torch.Tensor) -> torch.Tensor:
        # lr[t, h] = (base_lr / d) * sigmoid(X[t] . w_lr[h] + b_lr[h])  -> [B, H, T]
        logits = torch.einsum("btc,hc->bth", x, self.learnable_ttt_lr_weight[:, 0]) + self.learnable_ttt_lr_bias[:, 0]
        return self.lr_from_logits(logits, self.config.ttt_base_lr / self.head_dim)

    def forward(self, x: torch.Tensor, state: dict, start: int, decode: bool = False,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output for x (a block's normed hidden state), plus `residual` if given."""
        q, k, v = self.project(x, state, start)
        lr = self.learning_rates(x)
        eta_tok = mini_batch_etas(self.learnable_token_idx)
        step = self._mlp_step if self.mlp else self._linear_step
        outs = []
        for offset, count, inner in segments(start, x.shape[1], self.config.mini_batch_size):
            sl = slice(offset, offset + count)
            outs.append(step(state, q[:, :, sl], k[:, :, sl], v[:, :, sl], lr[:, :, sl], eta_tok, inner))
        return self.finish(x, torch.cat(outs, dim=2), residual)

    def _ln_params(self):
        H, d = self.num_heads, self.head_dim
        return self.ttt_norm_weight.reshape(H, 1, d), self.ttt_norm_bias.reshape(H, 1, d)

    def _linear_step(self, st, q, k, v, lr, eta_tok, inner):
        """One segment of one mini-batch (tokens inner..inner+n-1). q, k, v: [B, H, n, d]; lr: [B, H, n]."""
        gamma, beta = self._ln_params()
        n = q.shape[2]
        eta = eta_tok[inner:inner + n, None]  # [n, 1]
        W, b = st["W1"], st["b1"]
        g = ln_l2_grad(k @ W + b, v - k, gamma, beta)  # gradients at the boundary state
        lrg = lr[..., None] * g
        attn = torch.tril(q @ k.transpose(-1, -2) + 1)  # (q_i . k_j + 1), j <= i
        zbar = q @ W + b - eta * (attn @ lrg + self._earlier_sums(st, "1", q, inner))
        self._add_sums(st, {"1": (k, lrg)}, eta_tok, inner, n)
        return q + layer_norm(zbar, gamma, beta)

    def _mlp_step(self, st, q, k, v, lr, eta_tok, inner):
        gamma, beta = self._ln_params()
        n = q.shape[2]
        eta = eta_tok[inner:inner + n, None]
        W1, b1, W2, b2 = st["W1"], st["b1"], st["W2"], st["b2"]
        z1 = k @ W1 + b1
        x2 = gelu_tanh(z1)
        g2 = ln_l2_grad(x2 @ W2 + b2, v - k, gamma, beta)
        g1 = (g2 @ W2.transpose(-1, -2)) * gelu_tanh_grad(z1)
        lrg1, lrg2 = lr[..., None] * g1, lr[..., None] * g2
        attn1 = torch.tril(q @ k.transpose(-1, -2) + 1)
        zbar1 = q @ W1 + b1 - eta * (attn1 @ lrg1 + self._earlier_sums(st, "1", q, inner))
        xbar2 = gelu_tanh(zbar1)
        attn2 = torch.tril(xbar2 @ x2.transpose(-1, -2) + 1)
        zbar2 = xbar2 @ W2 + b2 - eta * (attn2 @ lrg2 + self._earlier_sums(st, "2", xbar2, inner))
        self._add_sums(st, {"1": (k, lrg1), "2": (x2, lrg2)}, eta_tok, inner, n)
        return q + layer_norm(zbar2, gamma, beta)

    @staticmethod
    def _earlier_sums(st: dict, level: str, x: torch.Tensor, inner: int):
        """x @ GW + Gb: the gradient sums of this mini-batch's earlier tokens (none at its first token;
        skipping the zero products saves a state-sized product and its saved tensors in training)."""
        return 0.0 if inner == 0 else x @ st["GW" + level] + st["Gb" + level]

    def _add_sums(self, st: dict, grads: dict, eta_tok: torch.Tensor, inner: int, n: int) -> None:
        """Add this segment's gradient sums GW += x^T lrg, Gb += sum(lrg) (grads: level -> (x, lrg));
        at the end of a mini-batch commit W <- W - eta_tok[b] * GW (likewise b) and clear them.
        A whole mini-batch (training) commits its own sums directly, and scales x rather than the
        product: then autograd keeps no state-sized tensor for eta's gradient."""
        eta = eta_tok[-1]
        end = inner + n == self.config.mini_batch_size
        for level, (x, lrg) in grads.items():
            W, b, GW, Gb = (name + level for name in ("W", "b", "GW", "Gb"))
            if inner == 0 and end:
                st[W] = st[W] - (eta * x).transpose(-1, -2) @ lrg
                st[b] = st[b] - eta * lrg.sum(-2, keepdim=True)
                continue  # (the sums stay the zeros of the last commit)
            gw, gb = x.transpose(-1, -2) @ lrg, lrg.sum(-2, keepdim=True)
            if inner != 0:
                gw, gb = st[GW] + gw, st[Gb] + gb
            if end:
                st[W], st[b] = st[W] - eta * gw, st[b] - eta * gb
                st[GW], st[Gb] = torch.zeros_like(gw), torch.zeros_like(gb)
            else:
                st[GW], st[Gb] = gw, gb
