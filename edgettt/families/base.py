"""What every family's language model is built from (DESIGN 2): the norms, the SwiGLU MLP, the
products a layer may compute in one piece, the decode state and the language-model shell.

    model: embed -> blocks -> RMSNorm -> lm_head        (`LanguageModel`; a family gives the blocks)
    block: its mixer and an MLP, each adding to the residual (the residual adds, the MLP's norm and the
           mixer's output norm pass into `product`, which a layer that can may compute in one piece)

API: `model(ids) -> logits`; `model.prefill(ids, state) -> (logits, state)`;
`model.init_state(batch)`; `model.step(ids[:, t], state) -> (logits, state)`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from edgettt.formats.state_formats import state_format
from edgettt.formats.state_roles import StateRole
from edgettt.ops import rms_norm, tokens_from


def product(layer: nn.Module, x: torch.Tensor, norm: nn.Module | None = None, up: torch.Tensor | None = None,
            residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """residual + layer(x'), x' = norm(x) with a norm, silu(x) * up with `up`, else x (residual optional);
    `glu`: layer is a stacked gate/up product, and the result silu(gate) * up of its two halves instead.
    A layer that can compute all of it in one piece (`product_with`: what `edgettt.prepare` gives the int4
    layers of a compiled decode step, `fast_paths.fused_products`) is handed it whole."""
    whole = getattr(layer, "product_with", None)
    if whole is not None and (y := whole(x, norm, up, residual, glu)) is not None:
        return y
    if norm is not None:
        x = norm(x)
    if up is not None:
        x = F.silu(x) * up
    y = layer(x)
    if glu:
        gate, up_half = y.chunk(2, dim=-1)
        return F.silu(gate) * up_half
    return y if residual is None else residual + y


def depthwise_conv(channels: int, kernel: int) -> nn.Conv1d:
    """Parameter holder with the ttt-lm-pytorch shapes: weight [C, 1, K], bias [C]."""
    return nn.Conv1d(channels, channels, kernel, groups=channels, bias=True)


class FusableInputs:
    """A module with several projections of the same input, a block's normalized hidden state (the
    mixer's q/k/v, the MLP's gate/up). `fuse_input_projections` may replace them with one product of
    their concatenated weights (it sets `fused_inputs`, a module returning the same tuple): fewer,
    larger matmuls. The ONNX export does it (int8 activations then quantized once, and per tensor in a
    prefill: the normalized input's narrow range allows it), and `edgettt.prepare` (serving stacks
    fuse q/k/v and gate/up; the Llama baseline's are fused too)."""

    def input_projection_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def project_inputs(self, x: torch.Tensor, norm: nn.Module | None = None) -> tuple[torch.Tensor, ...]:
        """The projections of norm(x) (of x without a norm)."""
        fused = getattr(self, "fused_inputs", None)
        if fused is not None:
            return fused(x, norm)
        if norm is not None:
            x = norm(x)
        return tuple(getattr(self, name)(x) for name in self.input_projection_names())


class SplitOutputs(nn.Module):
    """One product of several layers' stacked rows, split back into each layer's output."""

    def __init__(self, linear: nn.Module, sizes: list[int]):
        super().__init__()
        self.linear, self.sizes = linear, sizes

    def forward(self, x, norm: nn.Module | None = None):
        return tuple(product(self.linear, x, norm).split(self.sizes, dim=-1))


def fuse_input_projections(model: nn.Module, stack) -> int:
    """Replace each `FusableInputs` module's projections of one input with `stack(layers)`, one layer
    computing all of them (None: left as they are). Returns the number of modules fused."""
    fused = 0
    for module in list(model.modules()):
        if not isinstance(module, FusableInputs) or getattr(module, "fused_inputs", None) is not None:
            continue
        names = module.input_projection_names()
        layers = [getattr(module, name) for name in names]
        stacked = stack(layers)
        if stacked is not None:
            module.fused_inputs = SplitOutputs(stacked, [m.out_features for m in layers])
            for name in names:
                delattr(module, name)
            fused += 1
    return fused


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


class FlaBlock(nn.Module):
    """A block in flash-linear-attention's layout (LaCT's and DeltaNet's checkpoints): h += attn(attn_norm(h));
    h += mlp(mlp_norm(h)), the MLP a SwiGLU of `config.mlp_size`; `mixer` is the block's state layer."""

    def __init__(self, config, mixer: nn.Module):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.attn = mixer
        self.mlp_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.mlp_size)

    def forward(self, h, state: dict, start: int, decode: bool):
        h = h + self.attn(self.attn_norm(h), state, start, decode)
        return self.mlp(h, self.mlp_norm, residual=h)


class FlaBackbone(nn.Module):
    """flash-linear-attention's `model`: embeddings, `FlaBlock`s around `mixer_class(config)`, the final norm."""

    def __init__(self, config, mixer_class):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(FlaBlock(config, mixer_class(config)) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)


@dataclasses.dataclass
class State:
    """Decode state of a batch: the position reached and, per layer, named tensors."""

    pos: int
    layers: list[dict[str, torch.Tensor]]


class LanguageModel(nn.Module):
    """What every family's language model shares (`families.ttt.model.CausalLM`, `families.lact.model.LaCTForCausalLM`):
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

    def state_roles(self) -> list[dict[str, StateRole]]:
        """Each layer's decode-state tensors (the dicts of `init_state`) by name: their roles and levels."""
        return [layer.state_roles() for _, layer in self.state_layers()]

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

    def commit_weights(self) -> list[float] | None:
        """Each layer's commit weight (what a mini-batch adds to the state with; 0: never commits), where the family
        has one."""
        return None

    def state_decays(self) -> list[list[float]] | None:
        """A decayed form's gamma a commit, per layer and head; None for any other model."""
        return None

    def decode_state_bytes(self) -> int:
        """Bytes of one sequence's decode state as stored: the tensors a state format keeps (the layer's
        `formatted_state_names`: TTT's S, LaCT's fast weights) in its bytes (int12: 1.5 and a 4-byte step a row, int8: 1, fp16: 2),
        everything else (A, running sums, conv tails, window keys and values, an original layer's W) as it is."""
        total = 0
        for (_, layer), tensors, roles in zip(self.state_layers(), self.init_state(1).layers, self.state_roles()):
            fmt = state_format(getattr(layer, "state_format", "fp32"))  # (an original TTT layer has none)
            kept = layer.formatted_state_names() if fmt.bytes_per_element is not None else ()
            for name, t in tensors.items():
                total += (t.numel() * fmt.bytes_per_element + t.numel() // t.shape[-1] * fmt.row_bytes if name in kept
                          else fmt.kept_bytes(roles[name].role, t))
        return int(total)
