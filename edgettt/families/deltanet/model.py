"""The DeltaNet and Gated DeltaNet language models, their module names those of flash-linear-attention's
checkpoints (`DeltaNetForCausalLM`, `GatedDeltaNetForCausalLM`) so that one loads with `load_state_dict` as it is.
No file I/O here.

    block: h += o_proj(DeltaRuleLayer(RMSNorm_attn(h))); h += SwiGLU(RMSNorm_mlp(h))
    model: embeddings -> blocks -> RMSNorm -> lm_head

Inside a layer: q, k, v projections, each through a short causal convolution and silu (DeltaNet: q, k through
its `qk_activation`), q and k l2-normalised per head (DeltaNet: or sum-normalised), a step size
beta = sigmoid(b_proj x) (x2 with `allow_neg_eigval`; DeltaNet without `use_beta`: 1) and, in Gated DeltaNet, a
log decay g = -exp(A_log) softplus(a_proj x + dt_bias); the delta rule (`ops.delta_rule`) over the heads (with
more value heads than key heads each key head serves a group of them); a per-head RMSNorm, times act(g_proj x)
with the output gate; o_proj. A prefill runs the chunked form, a decode step the recurrence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edgettt.families.base import FlaBackbone, FusableInputs, LanguageModel, State
from edgettt.families.deltanet.config import DeltaRuleConfig
from edgettt.formats.state_roles import CONV, RECURRENT, StateRole
from edgettt.ops import causal_conv, rms_norm
from edgettt.ops.delta_rule import reference as delta_rule
from edgettt.quant.state_scales import StateScales

L2_EPS = 1e-6  # fla's l2norm
SUM_EPS = 1e-6  # fla's sum_norm (F.normalize with p=1)
CONVS = ("q", "k", "v")


def state_dtype(t: torch.Tensor) -> torch.dtype:
    """The state and the delta rule compute in float32 (float64 in a float64 model)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def swap_axes_1_2(t: torch.Tensor) -> torch.Tensor:
    """t.transpose(1, 2); where one of the two axes has length 1 (a decode step's one token), a reshape of the same
    memory: no Transpose node in an exported graph."""
    if t.shape[1] == 1 or t.shape[2] == 1:
        return t.reshape(t.shape[0], t.shape[2], t.shape[1], *t.shape[3:])
    return t.transpose(1, 2)


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, x + 1, x.clamp_max(0).exp())


QK_ACTIVATIONS = {"silu": F.silu, "relu": F.relu, "elu": elu_plus_one, "identity": lambda x: x}


class GatedRMSNorm(nn.Module):
    """A per-head RMSNorm, times act(gate) where there is a gate (fla's FusedRMSNormGated, RMSNorm)."""

    def __init__(self, size: int, eps: float, activation: str = "swish"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps, self.activation = eps, activation

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        y = rms_norm(x, self.weight, self.eps)
        if gate is None:
            return y
        return y * (torch.sigmoid(gate) if self.activation == "sigmoid" else F.silu(gate))


class DeltaRuleLayer(StateScales, FusableInputs, nn.Module):
    """fla's `GatedDeltaNet` layer (config.gated) or its `DeltaNet` layer, with their parameter names. A quantized
    state (`set_state_format`) is rounded as a decode step stores it, after every token: with one, or a
    calibration observer, a prefill runs the recurrence a token at a time (the rounding is sequential)."""

    chunk = staticmethod(delta_rule.chunk)  # the delta rule's two forms (`families/deltanet/kernels.py`: fla's)
    recurrent = staticmethod(delta_rule.recurrent)

    def __init__(self, config: DeltaRuleConfig):
        super().__init__()
        self.config = config
        self.observer = None  # calibration: called as observer(S, position) after each token
        c, C = config, config.hidden_size
        self.q_proj = nn.Linear(C, c.key_dim, bias=False)
        self.k_proj = nn.Linear(C, c.key_dim, bias=False)
        self.v_proj = nn.Linear(C, c.value_dim, bias=False)
        if c.gated:
            self.a_proj = nn.Linear(C, c.num_value_heads, bias=False)
            self.A_log = nn.Parameter(torch.zeros(c.num_value_heads))
            self.dt_bias = nn.Parameter(torch.zeros(c.num_value_heads))
        if c.gated or c.use_beta:
            self.b_proj = nn.Linear(C, c.num_value_heads, bias=False)
        if c.use_short_conv:
            for name, width in zip(CONVS, (c.key_dim, c.key_dim, c.value_dim)):
                setattr(self, f"{name}_conv1d", nn.Conv1d(width, width, c.conv_size, groups=width, bias=False))
        if c.use_gate:
            self.g_proj = nn.Linear(C, c.value_dim, bias=False)
        self.o_norm = GatedRMSNorm(c.head_v_dim, c.norm_eps, getattr(c, "output_gate_activation", "swish"))
        self.o_proj = nn.Linear(c.value_dim, C, bias=False)

    def initial_states(self) -> list[torch.Tensor]:
        """The state every sequence starts from, [value heads, K, V]: zeros (what a quantized state is taken
        relative to)."""
        c = self.config
        weight = self.o_norm.weight  # (a float parameter in every form: the projections may be quantized)
        return [weight.new_zeros(c.num_value_heads, c.head_k_dim, c.head_v_dim, dtype=state_dtype(weight))]

    def calibration_observer(self, layer: int, rowmax: dict):
        """What `calibrate` records of this layer's state along the text (`observer`): after each token, each
        (head, row)'s max |S| over the row ([H, K] a token, stacked to [H, K, T] a call) under
        rowmax["layer.1.dS"] (S - S0 with S0 = 0)."""
        def observe(S, position):
            rowmax.setdefault(f"{layer}.1.dS", []).append(S.detach().abs().amax(-1).amax(0)[..., None])
        return observe

    def _stored(self, start):
        """None, or (S, t) -> the state as stored after token t of a call from position `start`."""
        rounding = None if self.state_format.is_float32 else self.requantizer(1)
        if rounding is None and self.observer is None:
            return None

        def stored(S, t):
            if rounding is not None:
                S = rounding(S, start + t + 1)
            if self.observer is not None:
                self.observer(S, start + t + 1)
            return S
        return stored

    def state_roles(self) -> dict[str, StateRole]:
        roles = {"recurrent_state": StateRole(RECURRENT, 1)}
        if self.config.use_short_conv:
            roles.update({f"{name}_conv": StateRole(CONV) for name in CONVS})
        return roles

    def init_state(self, batch_size: int) -> dict[str, torch.Tensor]:
        c = self.config
        weight = self.o_norm.weight  # (a float parameter in every form: the projections may be quantized)
        state = {"recurrent_state": weight.new_zeros(batch_size, c.num_value_heads, c.head_k_dim, c.head_v_dim,
                                                     dtype=state_dtype(weight))}
        if c.use_short_conv:
            for name, width in zip(CONVS, (c.key_dim, c.key_dim, c.value_dim)):
                state[f"{name}_conv"] = weight.new_zeros(batch_size, c.conv_size - 1, width)
        return state

    def input_projection_names(self) -> tuple[str, ...]:
        """Every projection of the layer's input (an export makes them one product: `FusableInputs`)."""
        c = self.config
        kept = {"a_proj": c.gated, "b_proj": c.gated or c.use_beta, "g_proj": c.use_gate}
        return ("q_proj", "k_proj", "v_proj", *(name for name, kept in kept.items() if kept))

    def _features(self, proj: dict, state: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [B, T, width] after the short convolutions and activations."""
        c = self.config
        qk_act = F.silu if c.gated else QK_ACTIVATIONS[c.qk_activation]
        q, k, v = proj["q_proj"], proj["k_proj"], proj["v_proj"]
        if not c.use_short_conv:
            return qk_act(q), qk_act(k), F.silu(v)
        out = []
        for name, t, act in zip(CONVS, (q, k, v), (qk_act, qk_act, F.silu)):
            silu = act is F.silu  # the convolution's own SiLU (one node in an exported graph)
            y, state[f"{name}_conv"] = causal_conv(t, getattr(self, f"{name}_conv1d").weight, None,
                                                   state[f"{name}_conv"], silu=silu)
            out.append(y if silu else act(y))
        return tuple(out)

    def _heads(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        B, T, _ = x.shape  # [B, T, H * dim] -> [B, H, T, dim]
        return swap_axes_1_2(x.reshape(B, T, -1, dim))

    def _normalize(self, t: torch.Tensor) -> torch.Tensor:
        if not self.config.gated and self.config.qk_norm == "sum":
            return t / t.abs().sum(-1, keepdim=True).clamp_min(SUM_EPS)
        return l2_normalize(t.to(state_dtype(t)))

    def _step_sizes(self, x: torch.Tensor, proj: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """beta and the log decay g (None without a gate), [B, value heads, T], in float32."""
        c = self.config
        if c.gated or c.use_beta:
            beta = torch.sigmoid(proj["b_proj"].to(state_dtype(x)))
        else:
            beta = x.new_ones(x.shape[:2] + (c.num_value_heads,), dtype=state_dtype(x))
        if c.allow_neg_eigval:
            beta = beta * 2.0
        g = None
        if c.gated:
            dtype = state_dtype(x)
            g = -self.A_log.to(dtype).exp() * F.softplus(proj["a_proj"].to(dtype) + self.dt_bias.to(dtype))
            g = swap_axes_1_2(g)
        return swap_axes_1_2(beta), g

    def forward(self, x: torch.Tensor, state: dict, start: int, decode: bool = False) -> torch.Tensor:
        c = self.config
        proj = dict(zip(self.input_projection_names(), self.project_inputs(x)))
        q, k, v = self._features(proj, state)
        q, k = (self._normalize(self._heads(t, c.head_k_dim)) for t in (q, k))
        v = self._heads(v, c.head_v_dim)
        groups = c.num_value_heads // c.num_k_heads
        if groups > 1:  # grouped values: key head i serves value heads i * groups .. (i + 1) * groups - 1
            q, k = q.repeat_interleave(groups, dim=1), k.repeat_interleave(groups, dim=1)
        beta, g = self._step_sizes(x, proj)
        stored = self._stored(start)
        v = v.to(state_dtype(v))
        if stored is not None or decode or x.shape[1] == 1:
            o, state["recurrent_state"] = self.recurrent(q, k, v, beta, g, state["recurrent_state"], stored=stored)
        else:
            o, state["recurrent_state"] = self.chunk(q, k, v, beta, g, state["recurrent_state"],
                                                     chunk_size=c.prefill_chunk)
        o = swap_axes_1_2(o)  # [B, T, HV, V]
        gate = proj["g_proj"].reshape(o.shape) if c.use_gate else None
        o = self.o_norm(o, gate).to(x.dtype)
        return self.o_proj(o.flatten(2))


class DeltaRuleForCausalLM(LanguageModel):
    EMBEDDING_KEY = "model.embeddings.weight"
    STATE_LAYER = "attn"
    OPEN_MINI_BATCH = False  # the state takes every token as it comes; nothing is kept open

    def __init__(self, config: DeltaRuleConfig):
        super().__init__(config, FlaBackbone(config, DeltaRuleLayer))

    @classmethod
    def state_format_refusal(cls, name: str) -> str | None:
        if name == "int8-tensor":
            return ("the state format int8-tensor takes its one scale from the initial state, which is zero for the "
                    "delta rule; use int8 (calibrated scales) or int12")
        return super().state_format_refusal(name)

    def init_state(self, batch_size: int) -> State:
        return State(0, [layer.attn.init_state(batch_size) for layer in self.model.layers])
