"""The converted layer: a TTT layer written as a learned linear attention (DESIGN section 4).

Parameters, beside the shared projections of `MixerBase`:
    lr_proj.weight [H, C], lr_proj.bias [H]   learning-rate gate; lr = lr_scale * sigmoid(.)
    value_norm.weight, value_norm.bias [H, d]  the LN inside the value map and on the output
    state0 [H, d+1, d]                         TTT-Linear initial state S0 = [W1; b1]
    state0_1 [H, d+1, 4d], state0_2 [H, 4d+1, d]  TTT-MLP, one per level
    mask_eta [b]                               eta_tok: the chunk mask coefficients
    decay_logit [H]                            a decayed parallel form (`state_decay`): gamma = exp(-exp(.))
Decode state per layer: S1, A1 (and S2, A2 for TTT-MLP), each [B, H, Dk, Dv], plus conv tails. With
a state format that keeps the open mini-batch's keys and values (`int12`), K1 [B, H, b, Dk] and V1
[B, H, b, Dv] in float16 take A's place: slot i holds the mini-batch's i-th token's ka and vh, and A
is their sum of products over the slots filled (b (Dk + Dv) values a head instead of Dk Dv); the
layer then reads every token's ka and vh rounded to float16, in prefill as in decode.

A quantized state (`set_state_format`, formats in `formats/state_formats.py`) is rounded at every
mini-batch commit; A keeps full precision inside the mini-batch. The int8 scales are buffers
state_scale_1, state_scale_2 [buckets, H, Dk] (buckets of state_bucket_tokens tokens; the last
bucket's scales hold beyond; [H, Dk]: one bucket): S - S0 grows along the text, and finer steps
early keep the commits' rounding errors, which add up, small.

Forms: `exact` takes each mini-batch's values at its boundary state (recurrent across mini-batches);
`parallel` takes all values at the initial state (one chunked linear attention over the sequence).
A decayed parallel form (`state_decay`) also decays each level's state towards its initial state by a
learned gamma a head at every commit (`la.Decay`).

This file is the plain math. `edgettt.prepare` makes a model fast on a GPU by giving its layers the
subclasses of `fast_paths.layers`, which run the same computation through Triton kernels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from edgettt.families.ttt.config import ModelConfig
from edgettt.families.ttt.mixer import MixerBase, zeros_state
from edgettt.ops import gelu_tanh, layer_norm, segments
from edgettt.ops.linear_attention import reference as la
from edgettt.formats.state_formats import FLOAT32_STATE, OPEN_DTYPE
from edgettt.formats.state_roles import CONV, OPEN_KEYS, OPEN_SUM, OPEN_VALUES, RECURRENT, StateRole
from edgettt.quant.state_scales import StateScales

DEFAULT_DECAY = 0.97  # a new decayed layer's gamma a mini-batch (the distillation learns each head's)


def decay_logit(gamma: float) -> float:
    """The parameter value whose gamma = exp(-exp(logit)) is `gamma` (0 < gamma < 1)."""
    return math.log(-math.log(gamma))


class LinearAttentionLayer(StateScales, MixerBase):
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
        if config.state_decay:
            self.decay_logit = nn.Parameter(torch.full((H,), decay_logit(DEFAULT_DECAY)))
        self.state_format = FLOAT32_STATE
        self.observer = None  # calibration: called as observer(level, ka, vh, S, A, start)

    def initial_states(self) -> list[torch.Tensor]:
        return [self.state0_1, self.state0_2] if self.mlp else [self.state0]

    def decay(self, level: int) -> la.Decay | None:
        """The decay of level `level`'s state at each commit (a decayed form), else None."""
        if not self.config.state_decay:
            return None
        return la.Decay(torch.exp(-torch.exp(self.decay_logit)), self.initial_states()[level - 1])

    def calibration_observer(self, layer: int, rowmax: dict):
        """What `calibrate` records of this layer's state along the text (`observer`): per position, each (head,
        row)'s max |S|, |S - S0| and |A| over the row, [H, Dk, T] a call, under rowmax["layer.level.S|dS|A"]."""
        def observe(level, ka, vh, S, A, start):
            S_pos, A_pos = la.states_by_position(ka, vh, S, A, self.mask_eta.detach(), start,
                                                 self.decay(level))  # [B, H, T, Dk, Dv]
            S0 = self.initial_states()[level - 1].detach()[None, :, None]
            for kind, x in (("S", S_pos), ("dS", S_pos - S0), ("A", A_pos)):
                per_row = x.abs().amax(-1).amax(0).transpose(1, 2)  # [H, Dk, T]
                rowmax.setdefault(f"{layer}.{level}.{kind}", []).append(per_row)
        return observe

    def keeps_keys_and_values(self) -> bool:
        """Whether the decode state keeps the open mini-batch's keys and values in place of A."""
        return self.state_format.keeps_keys_and_values

    def state_roles(self) -> dict[str, StateRole]:
        roles = {name: StateRole(CONV) for name in self.conv_state_shapes()}
        for level in range(1, len(self.initial_states()) + 1):
            roles[f"S{level}"] = StateRole(RECURRENT, level)
            if self.keeps_keys_and_values():
                roles[f"K{level}"], roles[f"V{level}"] = StateRole(OPEN_KEYS, level), StateRole(OPEN_VALUES, level)
            else:
                roles[f"A{level}"] = StateRole(OPEN_SUM, level)
        return roles

    def init_state(self, batch_size: int) -> dict:
        state = zeros_state(self.conv_state_shapes(), batch_size, self.mask_eta)
        b = self.config.mini_batch_size
        for level, s0 in enumerate(self.initial_states(), start=1):
            state[f"S{level}"] = s0.unsqueeze(0).repeat(batch_size, 1, 1, 1)  # trainable, as in ttt.py
            if (requant := self.requantizer(level)) is not None:
                state[f"S{level}"] = requant(state[f"S{level}"], 0)
            if self.keeps_keys_and_values():
                Dk, Dv = s0.shape[-2:]
                state[f"K{level}"] = s0.new_zeros(batch_size, s0.shape[0], b, Dk, dtype=OPEN_DTYPE)
                state[f"V{level}"] = s0.new_zeros(batch_size, s0.shape[0], b, Dv, dtype=OPEN_DTYPE)
            else:
                state[f"A{level}"] = torch.zeros_like(state[f"S{level}"])
        return state

    def commit_weight(self) -> float:
        """eta_tok of a mini-batch's last token: what a mini-batch adds to the state with (0: never commits)."""
        return float(self.mask_eta.detach()[-1])

    def learning_rates(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lr_proj(x)
        return self.lr_from_logits(logits, self.config.ttt_base_lr / self.head_dim)

    def forward(self, x: torch.Tensor, state: dict, start: int, decode: bool = False,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output for x (a block's normed hidden state), plus `residual` if given."""
        q, k, v = self.project(x, state, start)
        lr = self.learning_rates(x)
        attend = self.recurrent if decode else self.chunk
        if self.config.form == "parallel":
            out = self._mix(state, q, k, v, lr, start, self.initial_states(), attend)
        else:
            out = self._exact(state, q, k, v, lr, start, attend)
        return self.finish(x, out, residual)

    # the linear attention of a prefill and of a decode step (`la`'s signature)
    chunk = staticmethod(la.chunk)
    recurrent = staticmethod(la.recurrent)

    def _exact(self, state, q, k, v, lr, start, attend):
        """The exact form: values at each mini-batch's boundary state, so one mini-batch at a time."""
        outs = []
        for offset, count, _ in segments(start, q.shape[2], self.config.mini_batch_size):
            sl = slice(offset, offset + count)
            boundary = [state[f"S{level}"] for level in range(1, len(self.initial_states()) + 1)]
            outs.append(self._mix(state, q[:, :, sl], k[:, :, sl], v[:, :, sl], lr[:, :, sl],
                                  start + offset, boundary, attend))
        return torch.cat(outs, dim=2)

    def _mix(self, st, q, k, v, lr, start, value_states, attend):
        """Values at `value_states`, then the linear attention of each level. Returns [B, H, T, d]."""
        H, d = self.num_heads, self.head_dim
        gamma, beta = self.value_norm.weight.reshape(H, 1, d), self.value_norm.bias.reshape(H, 1, d)
        qa, ka = la.augment(q), la.augment(k)
        if not self.mlp:
            vh = self._linear_values(ka, k, v, lr, value_states[0], gamma, beta)
            zbar = self._attend(attend, 1, st, qa, ka, vh, start)
        else:
            vh1, vh2, ka2 = la.mlp_values(ka, k, v, lr, value_states[0], value_states[1], gamma, beta)
            qa2 = la.augment(gelu_tanh(self._attend(attend, 1, st, qa, ka, vh1, start)))
            zbar = self._attend(attend, 2, st, qa2, ka2, vh2, start)
        return q + layer_norm(zbar, gamma, beta)

    _linear_values = staticmethod(la.linear_values)

    def _attend(self, attend, level, st, qa, ka, vh, start):
        S = f"S{level}"
        kv = self.keeps_keys_and_values()
        if kv:  # every token's ka and vh as the buffer holds them, and A from the buffer
            ka, vh = self.state_format.kept_open(ka, vh)
            A = self._open_sum(st, level, start, qa.dtype)
        else:
            A = st[f"A{level}"]
        if self.observer is not None:
            self.observer(level, ka, vh, st[S], A, start)
        zbar, st[S], A = attend(qa, ka, vh, st[S], A, self.mask_eta, start, self.requantizer(level), self.decay(level))
        if kv:
            self._keep_open(st, level, ka, vh, start)
        else:
            st[f"A{level}"] = A
        return zbar

    def _write_slot(self, buffer, new, inner):
        """`buffer` [B, H, b, D] with slot `inner` (an int, or a 0-d tensor in an exported graph) holding one
        token's `new` [B, H, 1, D], in the buffer's type."""
        slot = torch.arange(self.config.mini_batch_size, device=buffer.device) == inner
        return torch.where(slot[:, None], new.to(buffer.dtype), buffer)

    def _filled(self, start):
        """Slots of the open mini-batch that hold a token before position `start` [b] (0/1)."""
        b = self.config.mini_batch_size
        front = start % b
        return (torch.arange(b, device=self.mask_eta.device) < front).to(self.mask_eta.dtype)

    def _open_sum(self, st, level, start, dtype) -> torch.Tensor:
        """A: the sum of ka^T vh over the open mini-batch's tokens before `start`, from the buffers."""
        K, V = st[f"K{level}"].to(dtype), st[f"V{level}"].to(dtype)
        return (K * self._filled(start).to(dtype)[:, None]).transpose(-1, -2) @ V

    def _keep_open(self, st, level, ka, vh, start) -> None:
        """The buffers after tokens start..: the slots of the mini-batch left open hold its tokens."""
        b = self.config.mini_batch_size
        for name, new in ((f"K{level}", ka), (f"V{level}", vh)):
            old = st[name]
            if torch.is_tensor(start):  # one token at a tensor position (an exported decode graph)
                st[name] = self._write_slot(old, new, start % b)
                continue
            front, T = start % b, new.shape[2]
            tokens = torch.cat((old[:, :, :front].to(new.dtype), new), dim=2)  # from the open mini-batch's start
            done = (front + T) // b * b  # positions in whole mini-batches, committed
            st[name] = F.pad(tokens[:, :, done:], (0, 0, 0, b - (front + T - done))).to(old.dtype)
