"""The converted layer: a TTT layer written as a learned linear attention (DESIGN section 4).

Parameters, beside the shared projections of `MixerBase`:
    lr_proj.weight [H, C], lr_proj.bias [H]   learning-rate gate; lr = lr_scale * sigmoid(.)
    value_norm.weight, value_norm.bias [H, d]  the LN inside the value map and on the output
    state0 [H, d+1, d]                         TTT-Linear initial state S0 = [W1; b1]
    state0_1 [H, d+1, 4d], state0_2 [H, 4d+1, d]  TTT-MLP, one per level
    mask_eta [b]                               eta_tok: the chunk mask coefficients
Decode state per layer: S1, A1 (and S2, A2 for TTT-MLP), each [B, H, Dk, Dv], plus conv tails.

Forms: `exact` takes each mini-batch's values at its boundary state (recurrent across mini-batches);
`parallel` takes all values at the initial state (one chunked linear attention over the sequence).
"""

from __future__ import annotations

import torch
from torch import nn

from . import linear_attention as la
from .config import ModelConfig
from .mixer import MixerBase, zeros_state
from .ops import gelu_tanh, layer_norm, segments


class LinearAttentionLayer(MixerBase):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        H, d, C, inner = self.num_heads, self.head_dim, config.hidden_size, config.inner_dim
        self.mlp = config.ttt_layer_type == "mlp"
        self.lr_proj = nn.Linear(C, H, bias=True)
        self.value_norm = nn.Module()
        self.value_norm.weight = nn.Parameter(torch.ones(H, d))
        self.value_norm.bias = nn.Parameter(torch.zeros(H, d))
        if self.mlp:
            self.state0_1 = nn.Parameter(torch.zeros(H, d + 1, inner))
            self.state0_2 = nn.Parameter(torch.zeros(H, inner + 1, d))
        else:
            self.state0 = nn.Parameter(torch.zeros(H, d + 1, d))
        self.mask_eta = nn.Parameter(torch.ones(config.mini_batch_size))

    def initial_states(self) -> list[torch.Tensor]:
        return [self.state0_1, self.state0_2] if self.mlp else [self.state0]

    def init_state(self, batch_size: int) -> dict:
        state = zeros_state(self.conv_state_shapes(), batch_size, self.mask_eta)
        for level, s0 in enumerate(self.initial_states(), start=1):
            state[f"S{level}"] = s0.detach().unsqueeze(0).repeat(batch_size, 1, 1, 1)
            state[f"A{level}"] = torch.zeros_like(state[f"S{level}"])
        return state

    def learning_rates(self, x: torch.Tensor) -> torch.Tensor:
        return self.lr_from_logits(self.lr_proj(x), self.config.ttt_base_lr / self.head_dim)

    def forward(self, x: torch.Tensor, state: dict, start: int, decode: bool = False) -> torch.Tensor:
        q, k, v = self.project(x, state, start)
        lr = self.learning_rates(x)
        attend = la.recurrent if decode else la.chunk
        if self.config.form == "parallel":
            out = self._mix(state, q, k, v, lr, start, self.initial_states(), attend)
        else:  # exact: values at each mini-batch's boundary state, so one mini-batch at a time
            outs = []
            for offset, count, _ in segments(start, x.shape[1], self.config.mini_batch_size):
                sl = slice(offset, offset + count)
                boundary = [state[f"S{level}"] for level in range(1, len(self.initial_states()) + 1)]
                outs.append(self._mix(state, q[:, :, sl], k[:, :, sl], v[:, :, sl], lr[:, :, sl],
                                      start + offset, boundary, attend))
            out = torch.cat(outs, dim=2)
        return self.finish(x, out)

    def _mix(self, st, q, k, v, lr, start, value_states, attend):
        """Values at `value_states`, then the linear attention of each level. Returns [B, H, T, d]."""
        H, d = self.num_heads, self.head_dim
        gamma, beta = self.value_norm.weight.reshape(H, 1, d), self.value_norm.bias.reshape(H, 1, d)
        qa, ka, eta = la.augment(q), la.augment(k), self.mask_eta
        if not self.mlp:
            vh = la.linear_values(ka, k, v, lr, value_states[0], gamma, beta)
            zbar, st["S1"], st["A1"] = attend(qa, ka, vh, st["S1"], st["A1"], eta, start)
        else:
            vh1, vh2, ka2 = la.mlp_values(ka, k, v, lr, value_states[0], value_states[1], gamma, beta)
            zbar1, st["S1"], st["A1"] = attend(qa, ka, vh1, st["S1"], st["A1"], eta, start)
            qa2 = la.augment(gelu_tanh(zbar1))
            zbar, st["S2"], st["A2"] = attend(qa2, ka2, vh2, st["S2"], st["A2"], eta, start)
        return q + layer_norm(zbar, gamma, beta)
