"""Randomly initialised TTT models: for tests, and for trying the pipeline without a checkpoint.

Scales are chosen so that every part of the computation matters (signals of order one, learning
rates that move the fast weights, non-trivial norms and token weights), not to train well.
"""

from __future__ import annotations

import math

import torch

from edgettt.families.ttt.config import ModelConfig
from edgettt.families.ttt.model import CausalLM
from edgettt.tokenizer import ByteTokenizer


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
