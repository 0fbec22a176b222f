"""Randomly initialised DeltaNet and Gated DeltaNet models (`edgettt create`), as flash-linear-attention initialises
them to train from scratch: linear and embedding weights N(0, initializer_range), norms 1, the short convolutions
as torch's Conv1d (uniform within 1/sqrt(kernel)), Gated DeltaNet's A = exp(A_log) uniform in (0, 16) and its
step dt = softplus(dt_bias) log-uniform in (0.001, 0.1).

`create --preset` sizes: flash-linear-attention's trainer (flame) configs for DeltaNet 340M and 1.3B and Gated
DeltaNet 1.3B (6 heads of 256 on 2048: queries and keys 0.75 x hidden, fla's rule for Gated DeltaNet's size), and a
Gated DeltaNet 340M by the same rule (6 heads of 128 on 1024), with the 32,000-token vocabulary.
"""

from __future__ import annotations

import math

import torch

from edgettt.families.deltanet.config import DeltaNetConfig, DeltaRuleConfig, GatedDeltaNetConfig
from edgettt.families.deltanet.model import DeltaRuleForCausalLM
from edgettt.families.config_file import check_fits_memory
from edgettt.tokenizer import ByteTokenizer

KINDS = {"gated-deltanet": GatedDeltaNetConfig, "deltanet": DeltaNetConfig}
PRESETS = {  # by `--family` kind; separate embedding and head, as published
    "gated-deltanet": {"340m": {"hidden_size": 1024, "num_hidden_layers": 21, "num_heads": 6, "head_dim": 128,
                                "tie_word_embeddings": False},
                       "1.3b": {"hidden_size": 2048, "num_hidden_layers": 21, "num_heads": 6, "head_dim": 256,
                                "tie_word_embeddings": False}},
    "deltanet": {"340m": {"hidden_size": 1024, "num_hidden_layers": 24, "num_heads": 8, "tie_word_embeddings": False},
                 "1.3b": {"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16,
                          "tie_word_embeddings": False}},
}
PRESET_VOCAB = 32000
# `create --set`: the keys it takes, with its defaults (a small byte-level model)
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 2, "intermediate_size": None, "vocab_size": 256,
         "conv_size": 4, "use_short_conv": True, "use_gate": True, "allow_neg_eigval": False,
         "tie_word_embeddings": True}
DEFAULTS = {"gated-deltanet": {**SMALL, "head_dim": 16}, "deltanet": SMALL}


def new_config(kind: str, sizes: dict) -> DeltaRuleConfig:
    """The config of `create --family KIND` with `sizes`: checked, and refused before allocating when its float32
    weights would not fit this machine's memory."""
    config = KINDS[kind](**sizes)
    config.validate("--set")
    with torch.device("meta"):
        parameters = DeltaRuleForCausalLM(config).num_parameters()
    check_fits_memory(4 * parameters, "--set")
    return config


def random_model(config: DeltaRuleConfig, seed: int = 0) -> DeltaRuleForCausalLM:
    gen = torch.Generator().manual_seed(seed)
    model = DeltaRuleForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(_init(name, param.shape, config.initializer_range, gen))
    model.tie_weights()
    model.tokenizer = ByteTokenizer() if config.vocab_size >= 256 else None
    return model.eval()


def _init(name: str, shape: torch.Size, std: float, gen: torch.Generator) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A_log":
        return (16 * torch.rand(shape, generator=gen)).clamp_min(1e-4).log()
    if leaf == "dt_bias":
        dt = torch.exp(torch.rand(shape, generator=gen) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        dt = dt.clamp_min(1e-4)
        return dt + torch.log(-torch.expm1(-dt))  # softplus(dt_bias) = dt
    if "conv1d" in name:
        bound = 1 / math.sqrt(shape[-1])
        return (2 * torch.rand(shape, generator=gen) - 1) * bound
    if len(shape) == 1:  # the norms
        return torch.ones(shape)
    return torch.randn(shape, generator=gen) * std
