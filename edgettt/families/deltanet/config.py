"""The DeltaNet and Gated DeltaNet configurations: the config.json keys flash-linear-attention 0.6 saves
(`DeltaNetConfig`, model type `delta_net`; `GatedDeltaNetConfig`, model type `gated_deltanet`), with its defaults.

Keys that only pick a kernel or a training detail there (`attn_mode`, `fuse_norm`, `fuse_swiglu`,
`fuse_cross_entropy`, `fuse_linear_cross_entropy`, `use_l2warp`, `use_cache`, `initializer_range`) do not change
the function in float32; they are kept for a round trip. What fla builds but edgettt does not read is refused by
`validate` with the key that asks for it: hybrid attention layers (`attn`), attention residuals
(`attnres_block_size`).

Head sizes: Gated DeltaNet has `num_heads` query/key heads of `head_dim` and `num_v_heads` (default `num_heads`)
value heads of `head_dim * expand_v`; DeltaNet `num_heads` heads of `hidden_size * expand_k / num_heads` (keys)
and `hidden_size * expand_v / num_heads` (values).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from edgettt.errors import EdgetttError
from edgettt.families.config_file import (check_intermediate_size, check_sizes_and_scalars, check_switches,
                                           config_dict, fla_mlp_size, known_and_extra, read_config_object)

GATED_DELTANET = "gated_deltanet"
DELTANET = "delta_net"
SIZE_LIMITS = {"vocab_size": 2**22, "hidden_size": 2**16, "num_hidden_layers": 1024, "num_heads": 1024,
               "conv_size": 64}
FORMS = ("parallel",)  # the chunked prefill with the recurrent decode: the model's own computation
KERNEL_ONLY = ("attn_mode", "fuse_norm", "fuse_swiglu", "fuse_cross_entropy", "fuse_linear_cross_entropy",
               "use_l2warp", "use_cache")
SWITCHES = ("use_gate", "use_short_conv", "allow_neg_eigval", "tie_word_embeddings")


@dataclasses.dataclass
class DeltaRuleConfig:
    """What both model types share (fla's common keys); `GatedDeltaNetConfig` and `DeltaNetConfig` add theirs."""

    hidden_size: int = 2048
    num_hidden_layers: int = 24
    num_heads: int = 16
    expand_v: float = 1.0
    use_gate: bool = False
    use_short_conv: bool = True
    allow_neg_eigval: bool = False
    conv_size: int = 4
    max_position_embeddings: int = 2048
    hidden_ratio: int | None = 4
    intermediate_size: int | None = None
    hidden_act: str = "swish"
    norm_eps: float = 1e-6
    attn: dict | None = None
    attnres_block_size: int | None = None
    tie_word_embeddings: bool = False
    vocab_size: int = 32000
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    initializer_range: float = 0.02
    attn_mode: str = "chunk"
    fuse_norm: bool = True
    fuse_swiglu: bool = True
    fuse_cross_entropy: bool = True
    fuse_linear_cross_entropy: bool = False
    use_l2warp: bool = False
    use_cache: bool = True
    form: str = "parallel"
    quantization: dict | None = None  # a quantized model's QuantConfig
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    MODEL_TYPE = ""

    @property
    def family(self) -> str:
        return self.MODEL_TYPE

    @property
    def gated(self) -> bool:
        return False

    # the sizes, by role (each subclass computes them from its own keys)
    num_k_heads = property(lambda self: self.num_heads)
    num_value_heads = property(lambda self: self.num_heads)

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.head_v_dim

    @property
    def mlp_size(self) -> int:
        return fla_mlp_size(self)

    # tokens a chunk of the prefill's chunked form (fla's chunk kernels' 64): what an export's verification must
    # cross (`onnx.verify`)
    prefill_chunk = 64

    @property
    def mini_batch_size(self) -> int:
        """Tokens between two updates of the state: every token (the name the export and runner give the commit
        period of every family)."""
        return 1

    def summary(self) -> dict:
        """The sizes and switches `info` reports beside every family's common ones."""
        return {"intermediate_size": self.mlp_size, "heads": [self.num_k_heads, self.num_value_heads],
                "head_dims": [self.head_k_dim, self.head_v_dim], "conv_size": self.conv_size,
                "options": {k: getattr(self, k) for k in SWITCHES + self.own_switches()}}

    def own_switches(self) -> tuple[str, ...]:
        return ()

    def size_line(self) -> str:
        """The same, in `info`'s words."""
        heads = (f"{self.num_heads} heads" if self.num_k_heads == self.num_value_heads
                 else f"{self.num_k_heads} query/key heads, {self.num_value_heads} value heads")
        conv = f", short convolutions of {self.conv_size}" if self.use_short_conv else ""
        return (f"MLP {self.mlp_size}; {heads}, state {self.head_k_dim} x {self.head_v_dim} a value head"
                f"{conv}{', output gate' if self.use_gate else ''}")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "DeltaRuleConfig":
        kind = {c.MODEL_TYPE: c for c in (GatedDeltaNetConfig, DeltaNetConfig)}.get(raw.get("model_type"))
        if kind is None or not issubclass(kind, cls):
            raise EdgetttError(f"{source}: model_type is {raw.get('model_type')!r}, expected "
                               f"{GATED_DELTANET!r} or {DELTANET!r}")
        known, extra = known_and_extra(kind, raw)
        config = kind(**known, extra=extra)
        config.validate(source)
        return config

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self, self.MODEL_TYPE)

    @classmethod
    def load(cls, path: Path) -> "DeltaRuleConfig":
        return cls.from_dict(read_config_object(path), source=str(path))

    def validate(self, source: str = "config.json") -> None:
        """Types, ranges and combinations, before anything is built from them (a config.json is input)."""
        def bad(what: str) -> EdgetttError:
            return EdgetttError(f"{source}: {what}; fix the config")

        if self.attn is not None:
            raise EdgetttError(f"{source}: attn is set: a hybrid with attention layers (layers "
                               f"{self.attn.get('layers') if isinstance(self.attn, dict) else self.attn}), which "
                               f"edgettt does not read; give a {self.MODEL_TYPE} model without attention layers")
        if self.attnres_block_size is not None:
            raise EdgetttError(f"{source}: attnres_block_size is set (attention residuals), which edgettt does not "
                               "read; give a model without it")
        check_sizes_and_scalars(self, SIZE_LIMITS, ("norm_eps", "expand_v"), bad)
        check_switches(self, SWITCHES + self.own_switches() + KERNEL_ONLY[1:], bad)
        for key, allowed in (("hidden_act", ("swish", "silu")), ("form", FORMS)):
            if getattr(self, key) not in allowed:
                raise bad(f"{key} is {getattr(self, key)!r}, expected one of {allowed}")
        if self.quantization is not None and not isinstance(self.quantization, dict):
            raise bad(f"quantization must be an object, got {self.quantization!r}")
        check_intermediate_size(self.intermediate_size, bad)
        self.validate_heads(bad)

    def validate_heads(self, bad) -> None:
        raise NotImplementedError


def _whole(value: float) -> int | None:
    """`value` as an int where it is one (fla's sizes from ratios must come out whole), else None."""
    return round(value) if math.isclose(value, round(value), rel_tol=1e-5) and round(value) > 0 else None


@dataclasses.dataclass
class GatedDeltaNetConfig(DeltaRuleConfig):
    hidden_size: int = 2048
    num_hidden_layers: int = 21
    num_heads: int = 6
    head_dim: int = 256
    num_v_heads: int | None = None
    expand_v: float = 2.0
    use_gate: bool = True
    output_gate_activation: str = "swish"

    MODEL_TYPE = GATED_DELTANET

    @property
    def gated(self) -> bool:
        return True

    num_value_heads = property(lambda self: self.num_v_heads or self.num_heads)
    head_k_dim = property(lambda self: self.head_dim)
    head_v_dim = property(lambda self: int(self.head_dim * self.expand_v))

    def validate_heads(self, bad) -> None:
        check_sizes_and_scalars(self, {"head_dim": 2**12}, (), bad)
        if self.num_v_heads is not None:
            check_sizes_and_scalars(self, {"num_v_heads": 1024}, (), bad)
            if self.num_v_heads % self.num_heads:
                raise bad(f"num_v_heads {self.num_v_heads} is not a multiple of num_heads {self.num_heads}")
        if _whole(self.head_dim * self.expand_v) is None:
            raise bad(f"head_dim {self.head_dim} x expand_v {self.expand_v} is not a whole number")
        if self.output_gate_activation not in ("swish", "silu", "sigmoid"):
            raise bad(f"output_gate_activation is {self.output_gate_activation!r}, expected one of 'swish', "
                      "'silu', 'sigmoid'")


@dataclasses.dataclass
class DeltaNetConfig(DeltaRuleConfig):
    expand_k: float = 1.0
    use_beta: bool = True
    use_output_norm: bool = True  # (fla builds the output norm whatever this says)
    qk_norm: str = "l2"
    qk_activation: str = "silu"

    MODEL_TYPE = DELTANET

    head_k_dim = property(lambda self: round(self.hidden_size * self.expand_k) // self.num_heads)
    head_v_dim = property(lambda self: round(self.hidden_size * self.expand_v) // self.num_heads)

    def own_switches(self) -> tuple[str, ...]:
        return ("use_beta", "use_output_norm")

    def validate_heads(self, bad) -> None:
        check_sizes_and_scalars(self, {}, ("expand_k",), bad)
        for key in ("expand_k", "expand_v"):
            dim = _whole(self.hidden_size * getattr(self, key))
            if dim is None or dim % self.num_heads:
                raise bad(f"hidden_size {self.hidden_size} x {key} {getattr(self, key)} is not a whole multiple of "
                          f"num_heads {self.num_heads}")
        for key, allowed in (("qk_norm", ("l2", "sum")), ("qk_activation", ("silu", "relu", "elu", "identity"))):
            if getattr(self, key) not in allowed:
                raise bad(f"{key} is {getattr(self, key)!r}, expected one of {allowed}")
