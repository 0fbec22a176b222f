"""TTT's language model (DESIGN 3.3), for every form.

    block: [h += dwconv(RMSNorm_conv(h))]; h += Mixer(RMSNorm_seq(h)); h += SwiGLU(RMSNorm_ffn(h))
    model: embed -> blocks -> RMSNorm -> lm_head   (the shell: `families.base.LanguageModel`)

The mixer is the original TTT layer (form "ttt", `original.py`) or the converted linear attention
("exact", "parallel", `converted.py`). Module names follow the ttt-lm-pytorch state dict
(`model.layers.{i}.seq_modeling_block`), so an original checkpoint loads with `load_state_dict` as it is.
"""

from __future__ import annotations

from torch import nn

from edgettt.families.base import LanguageModel, RMSNorm, State, SwiGLU, depthwise_conv
from edgettt.families.ttt.config import ModelConfig
from edgettt.families.ttt.converted import LinearAttentionLayer
from edgettt.families.ttt.original import TTTLayer
from edgettt.formats.state_roles import CONV, StateRole
from edgettt.ops import causal_conv


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


class CausalLM(LanguageModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config, Backbone(config))

    def init_state(self, batch_size: int) -> State:
        return State(0, [layer.init_state(batch_size) for layer in self.model.layers])

    def state_roles(self) -> list[dict[str, StateRole]]:
        return [{**roles, **({"conv": StateRole(CONV)} if hasattr(block, "conv") else {})}
                for roles, block in zip(super().state_roles(), self.model.layers)]

    def commit_weights(self) -> list[float] | None:
        """Each layer's eta_tok of its mini-batch's last token (`commit_weight`)."""
        return [round(layer.seq_modeling_block.commit_weight(), 6) for layer in self.model.layers]

    def state_decays(self) -> list[list[float]] | None:
        if not self.config.state_decay:
            return None
        return [[round(g, 6) for g in layer.seq_modeling_block.decay(1).gamma.tolist()] for layer in self.model.layers]
