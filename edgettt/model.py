"""The language model around the sequence mixers (DESIGN 3.3), for every form.

    block: [h += dwconv(RMSNorm_conv(h))]; h += Mixer(RMSNorm_seq(h)); h += SwiGLU(RMSNorm_ffn(h))
    (the residual adds, the MLP's norm and the mixer's output norm pass into `mixer.product`, which a
    layer that can may compute in one piece)
    model: embed -> blocks -> RMSNorm -> lm_head

The mixer is the original TTT layer (form "ttt") or the converted linear attention ("exact",
"parallel"). Module names follow the ttt-lm-pytorch state dict (`model.layers.{i}.seq_modeling_block`),
so an original checkpoint loads with `load_state_dict` as it is.

API: `model(ids) -> logits`; `model.prefill(ids, state) -> (logits, state)`;
`model.init_state(batch)`; `model.step(ids[:, t], state) -> (logits, state)`.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .config import ModelConfig
from .converted import LinearAttentionLayer
from .mixer import FusableInputs, depthwise_conv, product
from .ops import causal_conv, rms_norm, tokens_from
from .quant.state_formats import state_format
from .ttt import TTTLayer


class RMSNorm(nn.Module):
    norm_kind = "rms"  # (what a layer that applies the norm itself computes: `fast_paths.fused_products`)

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class SwiGLU(FusableInputs, nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def input_projection_names(self) -> tuple[str, ...]:
        return ("gate_proj", "up_proj")

    def forward(self, x, norm: nn.Module | None = None, residual: torch.Tensor | None = None):
        """(residual +) the MLP of norm(x) (of x without a norm)."""
        stacked = getattr(getattr(self, "fused_inputs", None), "linear", None)
        if hasattr(stacked, "product_with"):  # one gate/up layer that applies the activation as it stores
            return product(self.down_proj, product(stacked, x, norm, glu=True), residual=residual)
        gate, up = self.project_inputs(x, norm)
        return product(self.down_proj, gate, up=up, residual=residual)


class PreConv(nn.Module):
    """`pre_conv`: a causal depthwise conv over the RMS-normed hidden state."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.conv = depthwise_conv(config.hidden_size, config.conv_kernel)

    def forward(self, h, state: dict):
        y, state["conv"] = causal_conv(self.norm(h), self.conv.weight, self.conv.bias, state.get("conv"))
        return y


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        C, eps = config.hidden_size, config.rms_norm_eps
        if config.pre_conv:
            self.conv = PreConv(config)
        mixer = TTTLayer if config.form == "ttt" else LinearAttentionLayer
        self.seq_modeling_block = mixer(config)
        self.mlp = SwiGLU(C, config.intermediate_size)
        self.seq_norm = RMSNorm(C, eps)
        self.ffn_norm = RMSNorm(C, eps)

    def init_state(self, batch_size: int) -> dict:
        state = self.seq_modeling_block.init_state(batch_size)
        if hasattr(self, "conv"):
            state["conv"] = self.conv.conv.weight.new_zeros(batch_size, self.conv.conv.weight.shape[-1] - 1,
                                                            self.conv.conv.weight.shape[0])
        return state

    def forward(self, h, state: dict, start: int, decode: bool):
        if hasattr(self, "conv"):
            h = h + self.conv(h, state)
        h = self.seq_modeling_block(self.seq_norm(h), state, start, decode, residual=h)
        return self.mlp(h, self.ffn_norm, residual=h)


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@dataclasses.dataclass
class State:
    """Decode state of a batch: the position reached and, per layer, named tensors."""

    pos: int
    layers: list[dict[str, torch.Tensor]]


class LanguageModel(nn.Module):
    """What every family's language model shares (`CausalLM` here, `lact.model.LaCTForCausalLM`):
    `self.model` holds the embedding (named by `EMBEDDING_KEY`), the blocks (each called as
    block(h, layer_state, position, decode)) and the final norm; `lm_head` and `init_state` are the
    family's."""

    EMBEDDING_KEY = "model.embed_tokens.weight"
    STATE_LAYER = "seq_modeling_block"  # each block's module that keeps a state (`quant.state_scales.StateScales`)
    OPEN_MINI_BATCH = True  # its state keeps the open mini-batch's keys and values (what int12-kv8 holds in 8 bits)

    @classmethod
    def state_format_refusal(cls, name: str) -> str | None:
        """Why the state format `name` does not apply to this family (a format that would change nothing under
        its name), else None."""
        fmt = state_format(name)
        if fmt.open_int8 and not cls.OPEN_MINI_BATCH:
            return (f"the state format {fmt.name} keeps the open mini-batch's keys and values in 8 bits; this family's "
                    "state has none, so it would be int12 under another name; use --state int12")
        return None

    def __init__(self, config, backbone: nn.Module):
        super().__init__()
        self.config = config
        self.model = backbone
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.tokenizer = None  # set by `load`

    def state_layers(self) -> list[tuple[str, nn.Module]]:
        """(name, module) of each block's state-keeping layer, in order."""
        return [(f"model.layers.{i}.{self.STATE_LAYER}", getattr(layer, self.STATE_LAYER))
                for i, layer in enumerate(self.model.layers)]

    def embedding(self) -> nn.Module:
        return self.get_submodule(self.EMBEDDING_KEY.rsplit(".", 1)[0])

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings and isinstance(self.lm_head, nn.Linear):  # a quantized head ties the
            self.lm_head.weight = self.embedding().weight                            # other way (TiedEmbedding)

    @property
    def form(self) -> str:
        return self.config.form

    def init_state(self, batch_size: int) -> State:
        raise NotImplementedError

    def prefill(self, input_ids: torch.Tensor, state: State | None = None, decode: bool = False,
                logits_from=None) -> tuple[torch.Tensor, State]:
        """Logits [B, T, V] for input ids [B, T], continuing from `state` (a fresh one when None);
        with `logits_from` = t, only those of tokens t.. (generation needs the last token's alone)."""
        if state is None:
            state = self.init_state(input_ids.shape[0])
        h = self.embedding()(input_ids)
        for layer, layer_state in zip(self.model.layers, state.layers):
            h = layer(h, layer_state, state.pos, decode)
        state.pos = state.pos + input_ids.shape[1]  # not +=: a tensor position (exported graph) is the caller's
        if logits_from is not None:
            h = tokens_from(h, logits_from)
        logits = self.lm_head(self.model.norm(h))
        return (logits if logits.dtype == torch.float64 else logits.float()), state  # fp32 at least

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.prefill(input_ids)[0]

    def step(self, input_ids: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One decode step: ids [B] -> logits [B, V]; the state is updated in place and returned."""
        logits, state = self.prefill(input_ids[:, None], state, decode=True)
        return logits[:, 0], state

    def weights(self) -> dict[str, torch.Tensor]:
        """The state dict as saved: `lm_head.weight` left out when tied to the embedding."""
        sd = self.state_dict()
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return sd

    def num_parameters(self) -> int:
        return sum(t.numel() for t in self.weights().values())

    def decode_state_bytes(self) -> int:
        """Bytes of one sequence's decode state as stored: the tensors a state format keeps (the layer's
        `formatted_state_names`: TTT's S, LaCT's fast weights) in its bytes (int12: 1.5 and a 4-byte step a row, int8: 1, fp16: 2),
        everything else (A, running sums, conv tails, window keys and values, an original layer's W) as it is."""
        total = 0
        for (_, layer), tensors in zip(self.state_layers(), self.init_state(1).layers):
            fmt = state_format(getattr(layer, "state_format", "fp32"))  # (an original TTT layer has none)
            kept = layer.formatted_state_names() if fmt.bytes_per_element is not None else ()
            for name, t in tensors.items():
                total += (t.numel() * fmt.bytes_per_element + t.numel() // t.shape[-1] * fmt.row_bytes if name in kept
                          else fmt.kept_bytes(name, t))
        return int(total)


class CausalLM(LanguageModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config, Backbone(config))

    def init_state(self, batch_size: int) -> State:
        return State(0, [layer.init_state(batch_size) for layer in self.model.layers])

