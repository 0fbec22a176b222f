"""A DeltaNet or Gated DeltaNet checkpoint in flash-linear-attention's Hugging Face layout (config.json,
model.safetensors or its shards): its sizes checked against the weights file before a model is built.
`edgettt.checkpoint.load_model` loads it, as every family."""

from __future__ import annotations

from pathlib import Path

from edgettt.errors import EdgetttError
from edgettt.families.deltanet.config import DeltaRuleConfig
from edgettt.weights_io import FLOAT_DTYPES, STORAGE_DTYPES

FOREIGN_LAYERS = {"attn.r_proj": "an RWKV7", "attn.gk_proj": "a GLA", "attn.w_proj": "an RWKV",
                  "attn.in_proj": "a Mamba", "attn.qkv": "an attention"}  # a weight only another family has


def check_deltanet_sizes(config: DeltaRuleConfig, header: dict, source: Path) -> None:
    """The config's sizes and switches against the file's tensors, before a model of that size is built."""
    allowed = FLOAT_DTYPES + (STORAGE_DTYPES if config.quantization else ())
    bad = sorted(k for k, (_, dtype) in header.items() if dtype not in allowed)
    if bad:
        raise EdgetttError(f"{source.parent}: {bad[0]} has dtype {header[bad[0]][1] or 'unsupported'}; the weights "
                           "must be float16, bfloat16, float32 or float64 (integers only in a quantized model)")
    for marker, what in FOREIGN_LAYERS.items():
        found = next((k for k in header if f".{marker}." in k), None)
        if found is not None:
            raise EdgetttError(f"{source.parent}: {found} is {what} layer's weight, not {config.MODEL_TYPE}'s; "
                               "the weights are of another family")
    if "model.embeddings.weight" not in header and "lm_head.qweight" not in header:
        raise EdgetttError(f"{source.parent}: the weights file has no model.embeddings.weight; not an "
                           f"flash-linear-attention {config.MODEL_TYPE} checkpoint")
    C, V, c = config.hidden_size, config.vocab_size, config
    expect = {"model.embeddings.weight": ((V, C), "vocab_size, hidden_size"),
              "model.layers.0.attn.q_proj.weight": ((c.key_dim, C), "the key sizes"),
              "model.layers.0.attn.v_proj.weight": ((c.value_dim, C), "the value sizes (expand_v)"),
              "model.layers.0.attn.q_conv1d.weight": ((c.key_dim, 1, c.conv_size), "conv_size"),
              "model.layers.0.mlp.gate_proj.weight": ((c.mlp_size, C), "the MLP size (intermediate_size or "
                                                      "hidden_ratio)")}
    if c.gated:
        expect["model.layers.0.attn.a_proj.weight"] = ((c.num_value_heads, C), "num_v_heads")
    for name, (shape, keys) in expect.items():  # float tensors; a quantized layer's are checked when loaded
        if name in header and tuple(header[name][0]) != shape:
            raise EdgetttError(f"{source}: {keys} {list(shape)} disagree with {name} {list(header[name][0])} in the "
                               "weights file; the checkpoint does not match its config")
    for switch, module in (("use_short_conv", "q_conv1d"), ("use_gate", "g_proj")):  # (a quantized one: its codes)
        present = any(k.startswith(f"model.layers.0.attn.{module}.") for k in header)
        if present != getattr(c, switch):
            raise EdgetttError(f"{source}: {switch} is {str(getattr(c, switch)).lower()} but the weights file "
                               f"{'has' if present else 'has no'} model.layers.0.attn.{module}; the checkpoint does "
                               "not match its config")
    layers = {int(k.split(".")[2]) for k in header if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    if layers != set(range(config.num_hidden_layers)):
        raise EdgetttError(f"{source}: num_hidden_layers {config.num_hidden_layers} disagrees with the weights "
                           f"file's {len(layers)} layers; the checkpoint does not match its config")
