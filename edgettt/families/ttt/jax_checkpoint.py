"""ttt-lm-jax checkpoints, the format of the public TTT weights, read without JAX and without running code.

The TTT paper's training code (github.com/test-time-training/ttt-lm-jax) saves with its
`StreamingCheckpointer`: a file of msgpack pairs `(key path, flax bytes)`, one a tensor, where the
flax bytes are msgpack too, an array being an extension record `(shape, dtype name, raw bytes)`.
`streaming_params` holds the parameters (`model/h/0/seq_modeling_block/wq/kernel`, ...);
`streaming_train_state` the whole train state, whose parameters sit under `params/params/` beside
the optimizer's moments and the step, which are read past. msgpack is data only: nothing in the
file can run, and every record is checked (types, dtype names, sizes against the bytes) before use.

The architecture is read off the weights' shapes (sizes, TTT-Linear or TTT-MLP, the gate and the q/k
convolutions of `ttt_linear`/`ttt_mlp` against the `_base` blocks, the pre-convolution, a separate
lm_head); what the weights cannot show (the TTT base learning rate, RoPE theta, the RMSNorm epsilon)
comes from a config file beside the checkpoint (the JAX code's `ModelConfig` as JSON) or else from
the JAX code's own defaults and training scripts (base learning rate 1.0 for TTT-Linear, 0.1 for
TTT-MLP). The weights map onto the ttt-lm-pytorch layout edgettt's TTT model uses (Dense kernels
transposed, convolution kernels from [K, 1, C] to [C, 1, K]); the JAX rotary embedding's pair order is
the one that layout expects, so no weight is permuted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgpack
import numpy as np
import torch

from edgettt.families.ttt.config import ModelConfig
from edgettt.errors import EdgetttError

CHECKPOINT_NAMES = ("streaming_params", "streaming_train_state")
CONFIG_NAMES = ("model_config.json", "config.json")
TRAIN_STATE_PARAMS = ("params", "params")
NDARRAY, SCALAR = 1, 3  # flax's msgpack extension codes
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
          "int32": torch.int32, "int64": torch.int64, "uint32": torch.int32}
# the JAX training scripts' TTT base learning rate of each family (scripts/ttt_linear, scripts/ttt_mlp)
BASE_LR = {"linear": 1.0, "mlp": 0.1}
SOURCE_NOTE = ("Weights from a ttt-lm-jax checkpoint (github.com/test-time-training/ttt-lm-jax). The public TTT "
               "checkpoints' authors call them research checkpoints, trained on a Chinchilla-optimal token count, "
               "that do not generate coherent text.")


def stream_signature(path: Path) -> bool:
    """Whether a file starts as a streaming checkpoint does: a pair whose first item is a key path."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return False
    return len(head) == 2 and head[0] == 0x92 and (0x90 <= head[1] <= 0x9F or head[1] == 0xDC)


def find_checkpoint(path: Path) -> Path | None:
    """The checkpoint file `path` names: the file itself, or the one `streaming_params*` or
    `streaming_train_state*` file of a directory without an edgettt/ttt-lm-pytorch config.json."""
    if path.is_file():
        return path if stream_signature(path) else None
    if not path.is_dir() or _is_model_directory(path):
        return None
    found = sorted(p for p in path.iterdir() if p.is_file() and p.name.startswith(CHECKPOINT_NAMES))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise EdgetttError(f"{path}: several ttt-lm-jax checkpoints ({names}); give the one file to read")
    return found[0] if found else None


def _is_model_directory(path: Path) -> bool:
    config = path / "config.json"
    return config.is_file() and "seq_modeling_block" not in _read_json(config, quiet=True)


def read_arrays(path: Path) -> dict[tuple[str, ...], torch.Tensor]:
    """The parameters of a streaming checkpoint, by key path, as stored (bfloat16 stays bfloat16)."""
    arrays: dict[tuple[str, ...], torch.Tensor] = {}
    train_state = None
    try:
        with open(path, "rb") as f:
            unpacker = msgpack.Unpacker(f, raw=False, max_buffer_size=2**31 - 1, strict_map_key=True)
            for item in unpacker:
                key, value = _record(item, path)
                if train_state is None:
                    train_state = key[:1] in (("params",), ("opt_state",), ("step",))
                if train_state:
                    if key[:2] != TRAIN_STATE_PARAMS:
                        continue  # the optimizer's moments, the step
                    key = key[2:]
                arrays[key] = _decode(value, key, path)
    except (msgpack.UnpackException, ValueError) as exc:
        raise EdgetttError(f"{path}: not a readable ttt-lm-jax checkpoint ({exc}); "
                           "give the streaming_params or streaming_train_state file the JAX code saved") from None
    if not arrays:
        raise EdgetttError(f"{path}: holds no parameters; give the streaming_params or streaming_train_state file "
                           "the JAX code saved")
    return arrays


def _record(item, path: Path) -> tuple[tuple[str, ...], bytes]:
    if (not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], (list, tuple))
            or not item[0] or not all(isinstance(k, str) for k in item[0]) or not isinstance(item[1], bytes)):
        raise EdgetttError(f"{path}: a record is not (key path, bytes); not a ttt-lm-jax streaming checkpoint")
    return tuple(item[0]), item[1]


def _decode(value: bytes, key: tuple[str, ...], path: Path) -> torch.Tensor:
    """One flax-serialised array: an ndarray record, or the chunked form flax uses above 1 GiB."""
    where = "/".join(key)
    try:
        obj = msgpack.unpackb(value, raw=False, ext_hook=lambda code, data: _ExtRecord(code, data),
                              strict_map_key=False)
    except (msgpack.UnpackException, ValueError) as exc:
        raise EdgetttError(f"{path}: {where} is not a flax array ({exc}); the checkpoint is damaged") from None
    if isinstance(obj, _ExtRecord) and obj.code in (NDARRAY, SCALAR):
        return _ndarray(obj.data, where, path)
    if isinstance(obj, dict) and obj.get("__msgpack_chunked_array__") is True:
        return _chunked(obj, where, path)
    raise EdgetttError(f"{path}: {where} is not an array; not a ttt-lm-jax parameter")


class _ExtRecord:
    """A msgpack extension record, kept as bytes until its code is checked."""

    def __init__(self, code: int, data: bytes):
        self.code, self.data = code, data


def _ndarray(data: bytes, where: str, path: Path) -> torch.Tensor:
    try:
        shape, dtype_name, raw = msgpack.unpackb(data, raw=False)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise EdgetttError(f"{path}: {where}: bad array record ({exc}); the checkpoint is damaged") from None
    if dtype_name not in DTYPES:
        raise EdgetttError(f"{path}: {where} has dtype {dtype_name!r}; edgettt reads {', '.join(DTYPES)}")
    if (not isinstance(shape, (list, tuple)) or not all(isinstance(n, int) and 0 <= n < 2**40 for n in shape)
            or not isinstance(raw, bytes)):
        raise EdgetttError(f"{path}: {where}: bad array record (shape {shape!r}); the checkpoint is damaged")
    dtype = DTYPES[dtype_name]
    size = math.prod(shape) * dtype.itemsize
    if size != len(raw):
        raise EdgetttError(f"{path}: {where}: shape {list(shape)} of {dtype_name} needs {size} bytes, the record "
                           f"holds {len(raw)}; the checkpoint is damaged")
    flat = np.frombuffer(raw, dtype=np.uint8).copy()
    return torch.from_numpy(flat).view(dtype).reshape(shape)


def _chunked(obj: dict, where: str, path: Path) -> torch.Tensor:
    chunks, shape = obj.get("chunks"), obj.get("shape")
    if not isinstance(chunks, dict) or not isinstance(shape, dict):
        raise EdgetttError(f"{path}: {where}: bad chunked array; the checkpoint is damaged")
    parts = []
    for i in range(len(chunks)):
        part = chunks.get(str(i))
        if not isinstance(part, _ExtRecord) or part.code != NDARRAY:
            raise EdgetttError(f"{path}: {where}: chunk {i} missing; the checkpoint is damaged")
        parts.append(_ndarray(part.data, where, path).reshape(-1))
    dims = [shape.get(str(i)) for i in range(len(shape))]
    flat = torch.cat(parts) if parts else torch.empty(0)
    if not all(isinstance(n, int) and n >= 0 for n in dims) or math.prod(dims) != flat.numel():
        raise EdgetttError(f"{path}: {where}: chunks do not fill shape {dims}; the checkpoint is damaged")
    return flat.reshape(dims)


def _read_json(path: Path, quiet: bool = False) -> dict:
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        if quiet:
            return {}
        raise EdgetttError(f"{path}: not readable JSON ({exc}); give the JAX ModelConfig as JSON") from None
    if not isinstance(raw, dict):
        if quiet:
            return {}
        raise EdgetttError(f"{path}: not a JSON object; give the JAX ModelConfig as JSON")
    return raw


def config_beside(checkpoint: Path) -> tuple[dict, Path | None]:
    """The JAX ModelConfig saved as JSON next to the checkpoint, if there is one."""
    for name in CONFIG_NAMES:
        candidate = checkpoint.parent / name
        if candidate.is_file():
            raw = _read_json(candidate)
            if "seq_modeling_block" in raw:
                return raw, candidate
    return {}, None


class _Layout:
    """The checkpoint's parameter names under `model/h/{i}/`, and the errors that name the file; with
    `consume`, a tensor taken is removed from the checkpoint's dict."""

    def __init__(self, arrays: dict, path: Path, consume: bool = False):
        self.arrays, self.path, self.consume = arrays, path, consume

    def get(self, *key: str) -> torch.Tensor:
        try:
            tensor = self.arrays[key]
        except KeyError:
            raise EdgetttError(f"{self.path}: {'/'.join(key)} missing; not a complete ttt-lm-jax TTT checkpoint "
                               "(self-attention checkpoints are not TTT models)") from None
        if not tensor.is_floating_point():
            raise EdgetttError(f"{self.path}: {'/'.join(key)} is {tensor.dtype}, not floating point; not TTT weights")
        if self.consume:  # the caller owns it now: the checkpoint's copy goes once it is re-laid
            del self.arrays[key]
        return tensor

    def has(self, *key: str) -> bool:
        return key in self.arrays

    def block(self, i: int, *key: str) -> tuple[str, ...]:
        return ("model", "h", str(i), *key)


def infer_config(arrays: dict, path: Path, beside: dict, beside_path: Path | None) -> ModelConfig:
    """An edgettt ModelConfig (original TTT form) from the weights' shapes and the non-shape options."""
    layout = _Layout(arrays, path)
    vocab, hidden = layout.get("model", "wte", "embedding").shape
    layers = len({k[2] for k in arrays if k[:2] == ("model", "h")})
    heads, head_dim = layout.get(*layout.block(0, "seq_modeling_block", "ttt_norm/scale")).shape
    mlp = layout.has(*layout.block(0, "seq_modeling_block", "ttt_dense_1"))
    gated = layout.has(*layout.block(0, "seq_modeling_block", "wg", "kernel"))
    pre_conv = layout.has(*layout.block(0, "conv", "conv1", "kernel"))
    conv_key = layout.block(0, "conv", "conv1", "kernel") if pre_conv else \
        layout.block(0, "seq_modeling_block", "conv_q", "kernel")
    family = "mlp" if mlp else "linear"
    options = {"ttt_base_lr": BASE_LR[family], "rope_theta": 10000.0, "rms_norm_eps": 1e-6}
    options.update({k: beside[k] for k in options if k in beside})
    config = ModelConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=layout.get(*layout.block(0, "feed_forward", "w1", "kernel")).shape[1],
        ttt_layer_type=family, use_gate=gated, share_qk=gated, pre_conv=pre_conv,
        conv_kernel=layout.get(*conv_key).shape[0] if layout.has(*conv_key) else 4,
        mini_batch_size=layout.get(*layout.block(0, "seq_modeling_block", "learnable_token_idx")).shape[0],
        tie_word_embeddings=not layout.has("lm_head", "kernel"), **options,
        extra={"source": SOURCE_NOTE, "source_file": path.name})
    if head_dim * heads != hidden:
        raise EdgetttError(f"{path}: ttt_norm has {heads} heads of {head_dim}, the embedding {hidden} wide; "
                           "the checkpoint is inconsistent")
    config.validate(str(beside_path or path))
    _check_against_beside(config, beside, beside_path)
    return config


def _check_against_beside(config: ModelConfig, beside: dict, beside_path: Path | None) -> None:
    """A config file beside the checkpoint must describe the same model as its weights."""
    block = beside.get("seq_modeling_block")
    if beside_path is None or block is None:
        return
    expected = {"hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers,
                "num_attention_heads": config.num_attention_heads, "intermediate_size": config.intermediate_size,
                "mini_batch_size": config.mini_batch_size, "vocab_size": config.vocab_size}
    for key, value in expected.items():
        if key in beside and beside[key] != value:
            raise EdgetttError(f"{beside_path}: {key} {beside[key]!r} disagrees with the checkpoint's weights "
                               f"({value}); give the config the checkpoint was trained with")
    names = {("linear", True): "ttt_linear", ("mlp", True): "ttt_mlp", ("linear", False): "ttt_linear_base",
             ("mlp", False): "ttt_mlp_base"}
    if block != names[(config.ttt_layer_type, config.use_gate)]:
        raise EdgetttError(f"{beside_path}: seq_modeling_block {block!r} disagrees with the checkpoint's weights "
                           f"({names[(config.ttt_layer_type, config.use_gate)]}); give the matching config")


def edgettt_weights(arrays: dict, config: ModelConfig, path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under edgettt's (ttt-lm-pytorch's) names and shapes, taken out of
    `arrays` one by one (each re-laid before the next: no second copy of the model); every one used."""
    layout = _Layout(arrays, path, consume=True)
    out = {"model.embed_tokens.weight": layout.get("model", "wte", "embedding"),
           "model.norm.weight": layout.get("model", "ln_f", "kernel")}
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = layout.get("lm_head", "kernel").t().contiguous()
    for i in range(config.num_hidden_layers):
        out.update({name: t.contiguous() for name, t in _layer_weights(layout, i, config).items()})
    if arrays:
        stray = sorted("/".join(k) for k in arrays)
        raise EdgetttError(f"{path}: {stray[0]} is not a parameter of a ttt-lm-jax TTT model of this shape "
                           f"({len(stray)} such); not a TTT checkpoint edgettt reads")
    return out


def _layer_weights(layout: _Layout, i: int, config: ModelConfig) -> dict[str, torch.Tensor]:
    jax = lambda *key: layout.get(*layout.block(i, *key))  # noqa: E731
    mixer = lambda *key: jax("seq_modeling_block", *key)  # noqa: E731
    p, m = f"model.layers.{i}.", f"model.layers.{i}.seq_modeling_block."
    out = {p + "seq_norm.weight": jax("seq_norm", "kernel"), p + "ffn_norm.weight": jax("ffn_norm", "kernel"),
           p + "mlp.gate_proj.weight": jax("feed_forward", "w1", "kernel").t(),
           p + "mlp.up_proj.weight": jax("feed_forward", "w3", "kernel").t(),
           p + "mlp.down_proj.weight": jax("feed_forward", "w2", "kernel").t(),
           m + "learnable_token_idx": mixer("learnable_token_idx"),
           m + "learnable_ttt_lr_weight": mixer("learnable_ttt_lr/kernel").transpose(1, 2),
           m + "learnable_ttt_lr_bias": mixer("learnable_ttt_lr/bias"),
           m + "ttt_norm_weight": mixer("ttt_norm/scale"), m + "ttt_norm_bias": mixer("ttt_norm/bias"),
           m + "post_norm.weight": mixer("post_norm", "scale"), m + "post_norm.bias": mixer("post_norm", "bias"),
           m + "W1": mixer("ttt_dense_0"), m + "b1": mixer("ttt_bias_0"),
           m + "q_proj.weight": mixer("wq", "kernel").t(), m + "v_proj.weight": mixer("wv", "kernel").t(),
           m + "o_proj.weight": mixer("wo", "kernel").t()}
    if config.ttt_layer_type == "mlp":
        out.update({m + "W2": mixer("ttt_dense_1"), m + "b2": mixer("ttt_bias_1")})
    if config.share_qk:
        for conv in ("conv_q", "conv_k"):
            out[m + conv + ".weight"] = mixer(conv, "kernel").permute(2, 1, 0)
            out[m + conv + ".bias"] = mixer(conv, "bias")
        out[m + "g_proj.weight"] = mixer("wg", "kernel").t()
    else:
        out[m + "k_proj.weight"] = mixer("wk", "kernel").t()
    if config.pre_conv:
        out.update({p + "conv.norm.weight": jax("conv", "conv_norm", "kernel"),
                    p + "conv.conv.weight": jax("conv", "conv1", "kernel").permute(2, 1, 0),
                    p + "conv.conv.bias": jax("conv", "conv1", "bias")})
    return out


def load_jax_checkpoint(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Path]:
    """(config, edgettt weights as stored, the checkpoint file) of a ttt-lm-jax checkpoint."""
    checkpoint = find_checkpoint(path)
    if checkpoint is None:
        raise EdgetttError(f"{path}: not a ttt-lm-jax streaming checkpoint; give its streaming_params or "
                           "streaming_train_state file")
    beside, beside_path = config_beside(checkpoint)
    arrays = read_arrays(checkpoint)
    config = infer_config(arrays, checkpoint, beside, beside_path)
    return config, edgettt_weights(arrays, config, checkpoint), checkpoint
