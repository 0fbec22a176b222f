"""Randomly initialised TTT models: for tests, and for trying the pipeline without a checkpoint.

Scales are chosen so that every part of the computation matters (signals of order one, learning
rates that move the fast weights, non-trivial norms and token weights), not to train well.
"""

from __future__ import annotations

import math

import torch

from edgettt.families.ttt.config import PRESET_VOCAB, PRESETS, ModelConfig
from edgettt.families.ttt.model import CausalLM
from edgettt.tokenizer import ByteTokenizer


# `create --set`: the config.json keys it takes, with its defaults (a small byte-level model)
CREATE_DEFAULTS = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": None,
                   "vocab_size": 256, "mini_batch_size": 16, "share_qk": False, "pre_conv": False, "use_gate": False,
                   "tie_word_embeddings": True}
KINDS = ("linear", "mlp")  # `create --family`: the TTT layer type


def new_config(kind: str, sizes: dict) -> ModelConfig:
    """The config of `create --family KIND` with `sizes` (an MLP of 2.75 x hidden unless given): checked, and
    refused before allocating when its float32 weights would not fit this machine's memory."""
    if sizes["intermediate_size"] is None:
        sizes = {**sizes, "intermediate_size": int(2.75 * sizes["hidden_size"])}
    config = ModelConfig(**sizes, ttt_layer_type=kind)
    config.validate("--options")
    config.check_memory("--options")
    return config


def random_model(config: ModelConfig, seed: int = 0) -> CausalLM:
    gen = torch.Generator().manual_seed(seed)
    model = CausalLM(config)
    for name, param in model.named_parameters():
        param.data.copy_(_init(name, param.shape, gen))
    model.tie_weights()
    model.tokenizer = _default_tokenizer(config)
    return model.eval()


def _init(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen)
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf in ("weight", "ttt_norm_weight"):
        return 1 + 0.1 * noise
    if leaf in ("bias", "ttt_norm_bias", "b1", "b2", "learnable_ttt_lr_bias"):
        return 0.1 * noise
    if leaf == "learnable_token_idx":
        return 0.1 * noise
    if leaf == "learnable_ttt_lr_weight":
        return noise / math.sqrt(shape[-1])
    if "conv" in name:
        return noise / math.sqrt(shape[-1])
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        return 2 * noise / math.sqrt(shape[-1])  # logits of order a few units
    if leaf in ("W1", "W2"):
        return noise / math.sqrt(shape[-2])
    return noise / math.sqrt(shape[-1])  # linear layers: [out, in]


def _default_tokenizer(config: ModelConfig):
    return ByteTokenizer() if config.vocab_size >= 256 else None
