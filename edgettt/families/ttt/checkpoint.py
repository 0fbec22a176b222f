"""A TTT checkpoint (ttt-lm-pytorch's layout, or edgettt's converted models of it): its sizes checked against
the weights file before a model is built, and the model card of weights that came from elsewhere (ttt-lm-jax)."""

from __future__ import annotations

from pathlib import Path

from edgettt.errors import EdgetttError
from edgettt.families.ttt.config import ModelConfig
from edgettt.weights_io import FLOAT_DTYPES, STORAGE_DTYPES


def check_sizes(config: ModelConfig, header: dict, source: Path) -> None:
    """The config's sizes against the tensors the file holds, before a model is built from them: a
    config that disagrees with its weights (a typo of 10**9) must not allocate anything."""
    bad_dtype = sorted(k for k, (_, dtype) in header.items() if dtype not in FLOAT_DTYPES + STORAGE_DTYPES)
    if bad_dtype:
        name = bad_dtype[0]
        raise EdgetttError(f"{source.parent}: {name} has dtype {header[name][1] or 'unsupported'}; weights must be "
                           "float16, bfloat16, float32 or float64 (integers only in quantized models); re-save them "
                           "as float")
    C, V, L = config.hidden_size, config.vocab_size, config.num_hidden_layers
    H, d, b = config.num_attention_heads, config.head_dim, config.mini_batch_size
    expect = {"model.embed_tokens.weight": ((V, C), "vocab_size, hidden_size"),
              "model.norm.weight": ((C,), "hidden_size")}
    block = "model.layers.0.seq_modeling_block."
    for name in ("ttt_norm_weight", "value_norm.weight"):
        expect[block + name] = ((H, d), "num_attention_heads, head dim")
    for name in ("learnable_token_idx", "mask_eta"):
        expect[block + name] = ((b,), "mini_batch_size")
    expect["model.layers.0.mlp.gate_proj.weight"] = ((config.intermediate_size, C), "intermediate_size, hidden_size")
    for name, (shape, keys) in expect.items():
        if name in header and header[name][0] != shape:
            raise EdgetttError(f"{source}: {keys} {list(shape)} disagree with {name} {list(header[name][0])} in the "
                               "weights file; the checkpoint does not match its config")
    for name in ("scales", "scb"):  # a quantized gate_proj (int8, int4, LLM.int8): one row of scales per output
        shape = header.get(f"model.layers.0.mlp.gate_proj.{name}", (None,))[0]
        if shape is not None and shape[0] != config.intermediate_size:
            raise EdgetttError(f"{source}: intermediate_size {config.intermediate_size} disagrees with "
                               f"model.layers.0.mlp.gate_proj.{name} {list(shape)} in the weights file; the "
                               "checkpoint does not match its config")
    if "model.embed_tokens.weight" not in header and not (config.tie_word_embeddings and "lm_head.qweight" in header):
        raise EdgetttError(f"{source.parent}: the weights file has no model.embed_tokens.weight; not a TTT model's "
                           "weights")
    layers = {int(k.split(".")[2]) for k in header if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    if layers != set(range(L)):
        raise EdgetttError(f"{source}: num_hidden_layers {L} disagrees with the weights file's {len(layers)} layers; "
                           "the checkpoint does not match its config")


def source_card(config) -> str:
    """MODEL_CARD.md of a model whose weights came from elsewhere (`config.extra["source"]`, e.g. a
    ttt-lm-jax checkpoint): where from, what its authors say of them, and what the model is."""
    form = {"ttt": "the original mini-batch TTT computation"}.get(config.form, f"edgettt's {config.form} form")
    return (f"# {config.family}, {config.hidden_size} wide, {config.num_hidden_layers} layers\n\n"
            f"{config.extra['source']}\n\n"
            f"Checkpoint: `{config.extra.get('source_file', 'unknown')}`. Form: {form}. Vocabulary "
            f"{config.vocab_size:,}; TTT base learning rate {config.ttt_base_lr}, mini-batch {config.mini_batch_size}.\n")
