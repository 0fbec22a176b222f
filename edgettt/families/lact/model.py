"""The LaCT language model (model type `lact_swiglu`), its module names those of the public
checkpoints so that one loads with `load_state_dict` as it is. No file I/O here.

    block: h += o_proj(WindowAttention(x) + TTT(x)), x = RMSNorm_attn(h); h += SwiGLU(RMSNorm_mlp(h))
    model: embeddings -> blocks -> RMSNorm -> lm_head

Inside a layer (`LaCTLayer`), from one qkv projection: the window attention reads q, k (optionally
RMS-normed) rotated per attention head; the fast weights read q, k rescaled per channel
(`qk_scale`, `qk_offset`), through silu and a per-head l2 norm, rotated per attention head (unless
`ttt_nope`), and silu(v) (unless `no_v_silu`); three learning rates a token (softplus) and a momentum
gate (sigmoid); their output goes through a per-head RMSNorm and, with `learnable_ttt_scale`, a
per-head silu gate. Forms: "lact" (`fast_weights.exact`, every option) and "parallel"
(`linear_attention.chunk`, the W1-only variant); decode (one token) is the recurrent step of both.

API as `edgettt.families.ttt.model.CausalLM`: `prefill(ids, state) -> (logits, state)`, `init_state(batch)`,
`step(ids[:, t], state)`, `model(ids) -> logits`.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from edgettt.families.base import FlaBackbone, LanguageModel, RMSNorm, State
from edgettt.ops.lact import fast_weights as fw
from edgettt.ops.lact import parallel as linear_attention
from edgettt.ops.lact.reference import LowRank, wide
from edgettt.formats.state_roles import (FAST_WEIGHT_SUMS, FAST_WEIGHTS, GATE_SUM, GRADIENT_SUMS, MOMENTUM,
                                          WINDOW_KEYS, WINDOW_VALUES, StateRole)
from edgettt.quant.state_scales import StateScales
from edgettt.families.lact.config import LaCTConfig
from edgettt.families.lact.window import rotate_half, window_attention

BASE_LR = 0.001  # the public code's learning rate at zero logit (softplus parameterisation, "mamba")
TTT_NORM_EPS = 1e-5  # fla's RMSNorm default, used for q_norm, k_norm and ttt_norm


def inverse_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


class LowRankFastWeight(nn.Module):
    """An initial fast weight W = w_left @ w_right (+ 0.5 I): [H, rows, cols]."""

    def __init__(self, heads: int, rows: int, cols: int, rank: int, gain: float):
        super().__init__()
        self.w_left = nn.Parameter(torch.randn(heads, rows, rank) * gain / math.sqrt(rank))
        self.w_right = nn.Parameter(torch.randn(heads, rank, cols) * gain / math.sqrt(cols))

    def factors(self) -> LowRank:
        return LowRank(self.w_left, self.w_right)

    def forward(self) -> torch.Tensor:
        return self.factors().dense()


class LaCTLayer(StateScales, nn.Module):
    """A quantized fast-weight state (`set_state_format`, `quant/state_scales.py`) rounds the weights kept
    between chunks at every chunk end, relative to the initial weights (`initial_states`); the running
    sums and the momentum stay float. With one, or a calibration observer, both forms run the
    chunk-recurrent computation (the rounding is sequential; for the W1-only variant it equals the
    parallel form in float)."""

    def __init__(self, config: LaCTConfig):
        super().__init__()
        self.config = config
        self.observer = None  # calibration: called as observer(state, tokens) after each piece
        C, nh = config.hidden_size, config.num_lact_heads
        d, dh = config.fw_head_dim, config.fw_hidden_dim
        self.qkv = nn.Linear(C, 3 * C, bias=config.qkv_bias)
        if config.attn_qk_norm:
            self.q_norm, self.k_norm = RMSNorm(C, TTT_NORM_EPS), RMSNorm(C, TTT_NORM_EPS)
        self.o_proj = nn.Linear(C, C, bias=False)
        if config.w0_w2_low_rank > 0:
            self.w0 = LowRankFastWeight(nh, dh, d, config.w0_w2_low_rank, config.fw_init_gain)
            self.w2 = LowRankFastWeight(nh, dh, d, config.w0_w2_low_rank, config.fw_init_gain)
        else:
            self.w0 = nn.Parameter(torch.randn(nh, dh, d) / math.sqrt(d))
            self.w2 = nn.Parameter(torch.randn(nh, dh, d) / math.sqrt(d))
        self.w1 = nn.Parameter(torch.randn(nh, d, dh) / math.sqrt(dh))
        self.lr_proj = nn.Linear(C, 3 * config.lr_dim * nh)
        self.qk_scale = nn.Parameter(torch.ones(C, 2))
        self.qk_offset = nn.Parameter(torch.zeros(C, 2))
        if config.learnable_ttt_scale:
            self.ttt_scale_proj = nn.Linear(C, nh)
        self.ttt_norm = RMSNorm(d, TTT_NORM_EPS)
        if config.use_momentum:
            self.momentum_proj = nn.Sequential(nn.Linear(C, nh), nn.Sigmoid())

    def initial_weights(self) -> dict[str, torch.Tensor]:
        """The fast weights every sequence starts from, [H, rows, cols] by index "0", "1", "2"."""
        w0 = self.w0() if isinstance(self.w0, LowRankFastWeight) else self.w0
        w2 = self.w2() if isinstance(self.w2, LowRankFastWeight) else self.w2
        return {"0": w0, "1": self.w1, "2": w2}

    def _feature_weights(self, fixed: dict) -> dict:
        """The constant W0, W2 of the parallel form's feature map: low-rank ones as their factors (the
        feature map never forms the product)."""
        return {i: (m.factors() if isinstance(m, LowRankFastWeight) else fixed[i])
                for i, m in (("0", self.w0), ("2", self.w2))}

    def initial_states(self) -> list[torch.Tensor]:
        """The initial weights of the fast weights that learn, one a state level (W1 alone in the W1-only
        variant): what a quantized state is taken relative to."""
        initial = self.initial_weights()
        return [initial[i] for i in fw.learned(self.config)]

    @property
    def formatted_role(self) -> str:
        """What a state format keeps: the weights kept between chunks (with `ttt_prenorm` and weight norm, their
        unnormalised sums, of which the applied weights are a float copy); the running sums and momentum stay
        float."""
        return FAST_WEIGHT_SUMS if self.config.ttt_prenorm and self.config.lact_weight_norm else FAST_WEIGHTS

    def state_roles(self) -> dict[str, StateRole]:
        roles = {}
        for level, i in enumerate(fw.learned(self.config), start=1):
            roles[f"w{i}"], roles[f"g{i}"] = StateRole(FAST_WEIGHTS, level), StateRole(GRADIENT_SUMS, level)
            roles[f"p{i}"], roles[f"m{i}"] = StateRole(FAST_WEIGHT_SUMS, level), StateRole(MOMENTUM, level)
        roles.update(gate=StateRole(GATE_SUM), wk=StateRole(WINDOW_KEYS), wv=StateRole(WINDOW_VALUES))
        return {name: role for name, role in roles.items() if name in self._state_names()}

    def _state_names(self) -> set[str]:
        return {*fw.state_names(self.config), "wk", "wv"}

    def calibration_observer(self, layer: int, rowmax: dict):
        """What `calibrate` records of this layer's state along the text (`observer`): after each piece of
        `count` tokens, each (head, row)'s max |W - W_init| of the weights kept between chunks, once a token of
        the piece ([H, rows, count]; the weights change only at chunk ends), under rowmax["layer.level.dS"]."""
        kept = {r.level: name for name, r in self.state_roles().items() if r.role == self.formatted_role}

        def observe(st, count):
            for level, w0 in enumerate(self.initial_states(), start=1):
                per_row = (st[kept[level]] - w0.detach()).abs().amax(-1).amax(0)  # [H, rows]
                rowmax.setdefault(f"{layer}.{level}.dS", []).append(per_row[..., None].expand(*per_row.shape, count))
        return observe

    def _rounding(self):
        """None, or (level, weights, position) -> the weights as a quantized state keeps them."""
        if self.state_format.is_float32:
            return None
        rounders = [self.requantizer(level) for level in range(1, len(fw.learned(self.config)) + 1)]
        return lambda level, w, position: rounders[level - 1](w, position)

    def init_state(self, batch_size: int) -> dict:
        c = self.config
        initial = self.initial_weights()
        rounding = self._rounding()
        state = {}
        for level, i in enumerate(fw.learned(c), start=1):  # fast weights in float32 at least, as they are computed
            state[f"w{i}"] = wide(initial[i]).unsqueeze(0).repeat(batch_size, 1, 1, 1)
            if rounding is not None:
                state[f"w{i}"] = rounding(level, state[f"w{i}"], 0)
            state[f"g{i}"] = torch.zeros_like(state[f"w{i}"])
            if c.ttt_prenorm and c.lact_weight_norm:
                state[f"p{i}"] = state[f"w{i}"].clone()
            if c.use_momentum:
                state[f"m{i}"] = torch.zeros_like(state[f"w{i}"])
        if c.use_momentum:
            state["gate"] = wide(self.w1.new_zeros(batch_size, c.num_lact_heads))
        ring = (batch_size, c.num_attn_heads, c.window_size, c.attn_head_dim)
        state["wk"], state["wv"] = self.w1.new_zeros(ring), self.w1.new_zeros(ring)
        return state

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, C = x.shape  # [B, T, C] -> [B, heads, T, C / heads]
        return x.reshape(B, T, heads, C // heads).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        B, H, T, d = x.shape
        return x.transpose(1, 2).reshape(B, T, H * d)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[B, T, C] rotated per attention head (as the public code rotates the fast q, k too)."""
        heads = self._heads(x, self.config.num_attn_heads)
        return self._merge(rotate_half(heads, positions, self.config.rope_theta))

    def forward(self, x: torch.Tensor, state: dict, start: int, decode: bool = False) -> torch.Tensor:
        c = self.config
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if c.attn_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        positions = torch.arange(start, start + x.shape[1], device=x.device)
        attn = self._attention(q, k, v, state, start, positions)
        fast_q = q * self.qk_scale[:, 0] + self.qk_offset[:, 0]
        fast_k = k * self.qk_scale[:, 1] + self.qk_offset[:, 1]
        ttt = self._fast_weights(x, fast_q, fast_k, v, state, start, positions)
        return self.o_proj(attn + ttt)

    chunk = staticmethod(linear_attention.chunk)  # the parallel form's prefill

    def _attention(self, q, k, v, state, start, positions):
        c = self.config
        q, k, v = (self._heads(t, c.num_attn_heads) for t in (q, k, v))
        q, k = rotate_half(q, positions, c.rope_theta), rotate_half(k, positions, c.rope_theta)
        out, (state["wk"], state["wv"]) = window_attention(q, k, v, state.get("wk"), state.get("wv"), start,
                                                           c.window_size)
        return self._merge(out)

    def _fast_weights(self, x, q, k, v, state, start, positions):
        c = self.config
        nh = c.num_lact_heads
        if c.qkv_silu:
            q, k = F.silu(q), F.silu(k)
            if not c.no_v_silu:
                v = F.silu(v)
        q, k = (self._merge(fw.l2_normalize(self._heads(t, nh))) for t in (q, k))
        if not c.ttt_nope:
            q, k = self._rotate(q, positions), self._rotate(k, positions)
        q, k, v = (self._heads(t, nh) for t in (q, k, v))
        B, T, _ = x.shape
        lr = F.softplus(self.lr_proj(x).float() + inverse_softplus(BASE_LR))
        lr = lr.reshape(B, T, nh, 3, c.lr_dim).transpose(1, 2)  # [B, H, T, 3, lr_dim]
        gates = self.momentum_proj(x).float().transpose(1, 2) if c.use_momentum else None  # [B, H, T]
        initial = self.initial_weights()
        fixed = {i: w for i, w in initial.items() if i not in fw.learned(c)}
        rounding = self._rounding()
        one_token = torch.is_tensor(start)  # (one token at a position given as a tensor: an exported decode graph)
        if not one_token and c.form == "parallel" and T > 1 and rounding is None and self.observer is None:
            norms = {i: w.norm(dim=-1, keepdim=True) for i, w in initial.items()}
            out = self.chunk(state, self._feature_weights(fixed), c, norms, q, k, v, lr, gates, start)
        else:  # the chunk-recurrent computation on the fast weights (the state), in float32 at least
            out = self._chunk_recurrent(state, fixed, initial, q, k, v, lr, gates, start, rounding).to(v.dtype)
        out = self.ttt_norm(out)
        if c.learnable_ttt_scale:
            out = out * F.silu(self.ttt_scale_proj(x)).transpose(1, 2)[..., None]
        return self._merge(out)

    def _chunk_recurrent(self, state, fixed, initial, q, k, v, lr, gates, start, rounding):
        c = self.config
        q, k, v = wide(q), wide(k), wide(v)
        fixed = {i: wide(w) for i, w in fixed.items()}
        norms = {i: wide(w).norm(dim=-1, keepdim=True) for i, w in initial.items()}
        if torch.is_tensor(start):  # one token at a position given as a tensor (an exported decode graph)
            return fw.step(state, fixed, c, norms, q, k, v, lr, gates, start, rounding)
        return fw.exact(state, fixed, c, norms, q, k, v, lr, gates, start, rounding, self.observer)


class LaCTForCausalLM(LanguageModel):
    EMBEDDING_KEY = "model.embeddings.weight"
    STATE_LAYER = "attn"
    OPEN_MINI_BATCH = False  # the fast weights are updated a chunk at a time; nothing of a chunk is kept open

    def __init__(self, config: LaCTConfig):
        super().__init__(config, FlaBackbone(config, LaCTLayer))

    def init_state(self, batch_size: int) -> State:
        return State(0, [layer.attn.init_state(batch_size) for layer in self.model.layers])



def converted_copy(model: LaCTForCausalLM, form: str) -> LaCTForCausalLM:
    """The same weights in form "lact" (the chunk-recurrent computation) or "parallel" (the linear
    attention of the W1-only variant: exact for a W1-only model; for a full one it drops the W0/W2
    updates, the weight norm and Muon, an approximation whose drift `edgettt convert` reports)."""
    c = model.config
    changes = {"form": form}
    if form == "parallel":
        changes.update(lact_update_w0_w2=False, lact_weight_norm=False, use_muon=False)
    config = dataclasses.replace(c, **changes, extra=dict(c.extra))
    with torch.device("meta"):
        copy = LaCTForCausalLM(config)
    copy.load_state_dict({k: v.detach().clone() for k, v in model.weights().items()}, strict=False, assign=True)
    copy.tie_weights()
    copy.tokenizer = model.tokenizer
    return copy.eval()


def initialise(model: LaCTForCausalLM, seed: int, std: float = 0.02) -> LaCTForCausalLM:
    """The public code's initialisation (`LaCTPreTrainedModel._init_weights`) for training from
    scratch: linear and embedding weights N(0, std), biases 0, RMSNorm weights 1, qk_scale 1,
    qk_offset 0, fast weights W0, W2 N(0, 1/sqrt(d)) (low rank: the factors as `LowRankFastWeight`), W1
    N(0, 1/sqrt(dh))."""
    gen = torch.Generator().manual_seed(seed)
    c = model.config
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "bias" or name.endswith("qk_offset"):
            value = torch.zeros(p.shape)
        elif name.endswith(("norm.weight", "qk_scale")):
            value = torch.ones(p.shape)
        elif leaf in ("w0", "w2"):
            value = torch.randn(p.shape, generator=gen) / math.sqrt(c.fw_head_dim)
        elif leaf == "w1":
            value = torch.randn(p.shape, generator=gen) / math.sqrt(c.fw_hidden_dim)
        elif leaf == "w_left":
            value = torch.randn(p.shape, generator=gen) * c.fw_init_gain / math.sqrt(c.w0_w2_low_rank)
        elif leaf == "w_right":
            value = torch.randn(p.shape, generator=gen) * c.fw_init_gain / math.sqrt(c.fw_head_dim)
        else:
            value = torch.randn(p.shape, generator=gen) * std
        with torch.no_grad():
            p.copy_(value)
    model.tie_weights()
    return model
