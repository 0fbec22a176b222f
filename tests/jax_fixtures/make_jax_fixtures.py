"""Write the ttt-lm-jax fixtures: small checkpoints saved by the public JAX code itself, with its logits.

Each fixture is one option set of ttt-lm-jax's `ModelConfig` (the sequence-modelling block, the
pre-convolution, tied or separate lm_head, the TTT base learning rate, ...). The model is built and
run by the JAX code (`ttt.models.model.CausalLM`), its random weights (every parameter perturbed, so
that a wrong transpose or a swapped name cannot go unnoticed) are written by the JAX code's own
`StreamingCheckpointer`, and its float32 logits on fixed tokens go beside them in `reference.npz`.
`tests/test_jax_checkpoint.py` loads each checkpoint with edgettt and compares.

Run with JAX on the CPU and a checkout of https://github.com/test-time-training/ttt-lm-jax
(tested with its pinned flax 0.7.0 and jax/jaxlib 0.4.13, numpy 1.26, transformers 4.41, mlxu):

    PYTHONPATH=/path/to/ttt-lm-jax python tests/jax_fixtures/make_jax_fixtures.py tests/jax_fixtures

It is not run by the tests (they need no JAX); its outputs are committed.

    ... make_jax_fixtures.py --full-size 1b-TTT OUT

writes instead a checkpoint of a published size (a name of the JAX code's CONFIGS; random weights,
saved by the same checkpointer in its default bfloat16): what `benchmarks/convert_memory.py`
converts to measure the peak memory of a conversion at full size.
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
from ttt.infra.checkpoint import StreamingCheckpointer
from ttt.models.model import CausalLM, ModelConfig

SMALL = dict(vocab_size=96, hidden_size=32, num_attention_heads=2, intermediate_size=64, num_hidden_layers=2,
             max_sequence_length=32, mini_batch_size=8, remat_mini_batch_group_size=1, rope_theta=10000.0,
             rms_norm_eps=1e-6, initializer_range=0.02, conv_width=4)

# name: (ModelConfig updates, how it is saved). `beside`: a config file written next to the checkpoint
# (ModelConfig's JSON, as `load_config("json::...")` reads it), for options the weights cannot show.
FIXTURES = {
    "ttt-linear": (dict(seq_modeling_block="ttt_linear", pre_conv=True, tie_word_embeddings=True, ttt_base_lr=1.0),
                   dict(kind="params", float_dtype="fp32")),
    "ttt-mlp": (dict(seq_modeling_block="ttt_mlp", pre_conv=True, tie_word_embeddings=True, ttt_base_lr=0.1),
                dict(kind="params", float_dtype="fp32")),
    "ttt-linear-base-untied": (dict(seq_modeling_block="ttt_linear_base", pre_conv=False, tie_word_embeddings=False,
                                    ttt_base_lr=1.0),
                               dict(kind="params", float_dtype="fp32")),
    "ttt-mlp-base-conv2": (dict(seq_modeling_block="ttt_mlp_base", pre_conv=True, conv_width=2,
                                tie_word_embeddings=True, ttt_base_lr=0.1),
                           dict(kind="params", float_dtype="fp32")),
    "ttt-linear-trainstate-bf16": (dict(seq_modeling_block="ttt_linear", pre_conv=True, tie_word_embeddings=True,
                                        ttt_base_lr=1.0),
                                   dict(kind="train_state", float_dtype="bf16")),
    "ttt-mlp-config-beside": (dict(seq_modeling_block="ttt_mlp", pre_conv=False, tie_word_embeddings=True,
                                   ttt_base_lr=0.5, rope_theta=500.0, mini_batch_size=4, rms_norm_eps=1e-5),
                              dict(kind="params", float_dtype="fp32", beside=True)),
}
TOKENS_SEED, WEIGHTS_SEED = 0, 1


def perturbed(params, key):
    """Every parameter moved off its initial value (zeros, ones) by a small random amount."""
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(key, len(leaves))
    moved = [leaf + 0.05 * jax.random.normal(k, leaf.shape, leaf.dtype) for leaf, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(tree, moved)


def as_saved(params, float_dtype):
    """The weights as the checkpointer stores them (bf16 rounds them), back in float32 to run."""
    if float_dtype == "fp32":
        return params
    return jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)


def make(out: Path, name: str, updates: dict, saving: dict) -> None:
    config = ModelConfig.from_dict({**SMALL, **updates})
    model = CausalLM(config, dtype=jnp.float32, param_dtype=jnp.float32)
    tokens = jax.random.randint(jax.random.PRNGKey(TOKENS_SEED), (2, config.max_sequence_length), 0,
                                config.vocab_size)
    params = model.init(jax.random.PRNGKey(WEIGHTS_SEED), tokens)["params"]
    params = perturbed(params, jax.random.PRNGKey(WEIGHTS_SEED + 1))
    logits = model.apply({"params": as_saved(params, saving["float_dtype"])}, tokens).logits

    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    if saving["kind"] == "train_state":
        state = TrainState.create(params={"params": params}, tx=optax.adamw(1e-3), apply_fn=None)
        StreamingCheckpointer.save_train_state_to_file(state, str(folder / "streaming_train_state"),
                                                       float_dtype=saving["float_dtype"])
    else:
        StreamingCheckpointer.save_train_state_to_file(params, str(folder / "streaming_params"),
                                                       float_dtype=saving["float_dtype"])
    if saving.get("beside"):
        (folder / "model_config.json").write_text(config.to_json_string())
    np.savez(folder / "reference.npz", tokens=np.asarray(tokens, np.int64), logits=np.asarray(logits, np.float32))
    print(f"{name}: {config.seq_modeling_block}, logits {tuple(logits.shape)}")


def full_size(name: str, out: Path) -> None:
    """Random weights of the JAX code's config `name` as a TTT-Linear, saved as its checkpointer saves."""
    from ttt.models.model import CONFIGS

    config = ModelConfig.from_dict({**CONFIGS[name], "seq_modeling_block": "ttt_linear"})
    model = CausalLM(config, dtype=jnp.float32, param_dtype=jnp.float32)
    tokens = jnp.zeros((1, config.max_sequence_length), jnp.int32)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)["params"]
    rng = np.random.default_rng(WEIGHTS_SEED)
    params = jax.tree_util.tree_map(lambda s: (0.02 * rng.standard_normal(s.shape, np.float32)), shapes)
    out.mkdir(parents=True, exist_ok=True)
    StreamingCheckpointer.save_train_state_to_file(params, str(out / "streaming_params"), float_dtype="bf16")
    count = sum(x.size for x in jax.tree_util.tree_leaves(params))
    print(f"{name}: {count:,} parameters -> {out / 'streaming_params'}")


def main(out: str) -> None:
    out = Path(out)
    manifest = {}
    for name, (updates, saving) in FIXTURES.items():
        make(out, name, updates, saving)
        manifest[name] = {"config": {**SMALL, **updates}, "saved": saving}
    (out / "fixtures.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--full-size":
        full_size(sys.argv[2], Path(sys.argv[3]))
    else:
        main(sys.argv[1])
