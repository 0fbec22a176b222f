"""A LaCT checkpoint in the public layout (config.json of model type `lact_swiglu`, model.safetensors or
a weights-only pytorch_model.bin, or their shards): its sizes checked against the weights file before
a model is built. `edgettt.checkpoint.load_model` loads it, as every family."""

from __future__ import annotations

from pathlib import Path

from edgettt.errors import EdgetttError
from edgettt.weights_io import FLOAT_DTYPES, STORAGE_DTYPES
from edgettt.families.lact.config import LaCTConfig


def check_lact_sizes(config: LaCTConfig, header: dict, source: Path) -> None:
    """The config's sizes against the file's tensors, before a model of that size is built."""
    allowed = FLOAT_DTYPES + (STORAGE_DTYPES if config.quantization else ())
    bad = sorted(k for k, (_, dtype) in header.items() if dtype not in allowed)
    if bad:
        raise EdgetttError(f"{source.parent}: {bad[0]} has dtype {header[bad[0]][1] or 'unsupported'}; a LaCT "
                           "checkpoint's weights must be float16, bfloat16, float32 or float64 (integers only in "
                           "a quantized model)")
    C, V = config.hidden_size, config.vocab_size
    expect = {"model.embeddings.weight": ((V, C), "vocab_size, hidden_size"),
              "model.layers.0.attn.qkv.weight": ((3 * C, C), "hidden_size"),
              "model.layers.0.mlp.gate_proj.weight": ((config.mlp_size, C), "the MLP size (intermediate_size or "
                                                      "hidden_ratio)")}
    for name, (shape, keys) in expect.items():  # float tensors; a quantized layer's are checked when loaded
        if name in header and header[name][0] != shape:
            raise EdgetttError(f"{source}: {keys} {list(shape)} disagree with {name} {list(header[name][0])} in the "
                               "weights file; the checkpoint does not match its config")
    if "model.embeddings.weight" not in header and "lm_head.qweight" not in header:
        raise EdgetttError(f"{source.parent}: the weights file has no model.embeddings.weight; not a LaCT checkpoint")
    layers = {int(k.split(".")[2]) for k in header if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    if layers != set(range(config.num_hidden_layers)):
        raise EdgetttError(f"{source}: num_hidden_layers {config.num_hidden_layers} disagrees with the weights "
                           f"file's {len(layers)} layers; the checkpoint does not match its config")
