"""The LaCT configuration: the public `lact_swiglu` config.json keys, plus edgettt's own.

Public keys and defaults follow `configuration_lact_swiglu.py` of the LaCT repository
(`lact_llm/lact_model/`). Keys that only select a kernel or a training detail there
(`fuse_norm`, `fuse_swiglu`, `fuse_cross_entropy`, `use_fused_kernel`, `fp32_states`, `use_cache`,
`initializer_range`) do not change the function in float32; they are kept for a round trip.

edgettt's keys (absent from public configs, so a public checkpoint gets the public behaviour):
    lact_update_w0_w2  true: every fast weight learns (public); false: only W1 (W0, W2 stay as
                       initialised), the variant whose parallel form is an exact linear attention
    lact_weight_norm   true: rows of each updated fast weight rescaled to their initial norms after
                       each update (public); false: no weight normalisation
    form               "lact": the chunk-recurrent computation, every option; "parallel": the
                       linear-attention form, only for the W1-only variant (lact_update_w0_w2,
                       lact_weight_norm and use_muon all false), where it is exact. A full LaCT
                       model becomes one by dropping those updates (an approximation, as for
                       TTT-Linear: its drift is measured and distillation wins it back).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from edgettt.families.config_file import (check_intermediate_size, check_sizes_and_scalars, check_switches,
                                           config_dict, fla_mlp_size, known_and_extra, read_config_object)
from edgettt.errors import EdgetttError

LACT_MODEL_TYPE = "lact_swiglu"
LACT_FORMS = ("lact", "parallel")
SIZE_LIMITS = {"vocab_size": 2**22, "hidden_size": 2**16, "num_hidden_layers": 1024, "num_attn_heads": 1024,
               "num_lact_heads": 1024, "lact_chunk_size": 2**20, "window_size": 2**20}


@dataclasses.dataclass
class LaCTConfig:
    hidden_size: int = 2048
    num_hidden_layers: int = 24
    num_attn_heads: int = 32
    num_lact_heads: int = 4
    inter_multi: float = 1
    qkv_bias: bool = False
    attn_qk_norm: bool = False
    lact_chunk_size: int = 2048
    use_muon: bool = False
    lr_dim: int = 1
    qkv_silu: bool = True
    no_v_silu: bool = False
    lr_parameterization: str = "mamba"
    learnable_ttt_scale: bool = True
    use_momentum: bool = True
    ttt_loss_type: str = "dot_product"
    ttt_prenorm: bool = False
    ttt_nope: bool = False
    w0_w2_low_rank: int = -1
    window_size: int = 2048
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    hidden_ratio: int | None = 4
    intermediate_size: int | None = None
    hidden_act: str = "swish"
    norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    vocab_size: int = 32000
    fw_init_gain: float = 0.5
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    lact_update_w0_w2: bool = True
    lact_weight_norm: bool = True
    form: str = "lact"
    quantization: dict | None = None  # a quantized model's QuantConfig (weights only for LaCT so far)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def family(self) -> str:
        return "lact"

    def summary(self) -> dict:
        """The sizes and switches `info` reports beside every family's common ones."""
        return {"intermediate_size": self.mlp_size, "attention_heads": self.num_attn_heads, "window": self.window_size,
                "lact_heads": self.num_lact_heads, "fast_weight_dims": [self.fw_head_dim, self.fw_hidden_dim],
                "chunk": self.lact_chunk_size,
                "options": {k: getattr(self, k) for k in ("use_momentum", "use_muon", "lact_update_w0_w2",
                                                          "lact_weight_norm", "ttt_prenorm", "ttt_nope",
                                                          "learnable_ttt_scale", "tie_word_embeddings")}}

    def size_line(self) -> str:
        """The same, in `info`'s words."""
        return (f"MLP {self.mlp_size}; window attention {self.num_attn_heads} heads of {self.attn_head_dim} over "
                f"{self.window_size} tokens; {self.num_lact_heads} LaCT heads of {self.fw_head_dim} (hidden "
                f"{self.fw_hidden_dim}), chunk {self.lact_chunk_size}")

    @property
    def fw_head_dim(self) -> int:
        return self.hidden_size // self.num_lact_heads

    @property
    def fw_hidden_dim(self) -> int:
        return int(self.fw_head_dim * self.inter_multi)

    @property
    def attn_head_dim(self) -> int:
        return self.hidden_size // self.num_attn_heads

    @property
    def mlp_size(self) -> int:
        """The SwiGLU MLP's width: `intermediate_size`, or 2/3 of hidden_ratio x hidden rounded up to 256."""
        return fla_mlp_size(self)

    @property
    def mini_batch_size(self) -> int:
        """The tokens between two updates of the state (LaCT's chunk): the name the ONNX export, its
        verification and the runner give the commit period of every family."""
        return self.lact_chunk_size

    @property
    def w1_only(self) -> bool:
        """The variant whose parallel form is exact: only W1 learns, no weight norm, no Muon."""
        return not (self.lact_update_w0_w2 or self.lact_weight_norm or self.use_muon)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "LaCTConfig":
        if raw.get("model_type") != LACT_MODEL_TYPE:
            raise EdgetttError(f"{source}: model_type is {raw.get('model_type')!r}, expected {LACT_MODEL_TYPE!r}")
        known, extra = known_and_extra(cls, raw)
        config = cls(**known, extra=extra)
        config.validate(source)
        return config

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self, LACT_MODEL_TYPE)

    @classmethod
    def load(cls, path: Path) -> "LaCTConfig":
        return cls.from_dict(read_config_object(path), source=str(path))

    def validate(self, source: str = "config.json") -> None:
        """Types, ranges and combinations, before anything is built from them (a config.json is input)."""
        def bad(what: str) -> EdgetttError:
            return EdgetttError(f"{source}: {what}; fix the config")

        check_sizes_and_scalars(self, SIZE_LIMITS, ("rope_theta", "norm_eps", "inter_multi"), bad)
        check_switches(self, ("qkv_bias", "attn_qk_norm", "use_muon", "qkv_silu", "no_v_silu", "learnable_ttt_scale",
                              "use_momentum", "ttt_prenorm", "ttt_nope", "tie_word_embeddings", "lact_update_w0_w2",
                              "lact_weight_norm"), bad)
        C = self.hidden_size
        for heads in ("num_attn_heads", "num_lact_heads"):
            if C % getattr(self, heads):
                raise bad(f"hidden_size {C} is not divisible by {heads} {getattr(self, heads)}")
        if self.attn_head_dim % 2:
            raise bad(f"attention head dim {self.attn_head_dim} is odd; rotary embedding needs an even head dim")
        if self.fw_head_dim % self.attn_head_dim:
            raise bad(f"fast-weight head dim {self.fw_head_dim} is not a multiple of the attention head dim "
                      f"{self.attn_head_dim} (the fast q/k are rotated per attention head)")
        if self.fw_hidden_dim < 1:
            raise bad(f"inter_multi {self.inter_multi} leaves no fast-weight hidden units")
        if self.lr_dim not in (1, self.fw_head_dim) or (self.lr_dim > 1 and self.fw_hidden_dim != self.fw_head_dim):
            raise bad(f"lr_dim {self.lr_dim} must be 1 (or the fast-weight head dim when inter_multi is 1)")
        for key, allowed in (("lr_parameterization", ("mamba",)), ("ttt_loss_type", ("dot_product",)),
                             ("hidden_act", ("swish", "silu")), ("form", LACT_FORMS)):
            if getattr(self, key) not in allowed:
                raise bad(f"{key} is {getattr(self, key)!r}, expected one of {allowed}")
        if self.quantization is not None and not isinstance(self.quantization, dict):
            raise bad(f"quantization must be an object, got {self.quantization!r}")
        if self.form == "parallel" and not self.w1_only:
            raise bad("form 'parallel' needs the W1-only variant: lact_update_w0_w2, lact_weight_norm and "
                      "use_muon all false")
        if not isinstance(self.w0_w2_low_rank, int) or isinstance(self.w0_w2_low_rank, bool):
            raise bad(f"w0_w2_low_rank must be an integer (-1: full rank), got {self.w0_w2_low_rank!r}")
        check_intermediate_size(self.intermediate_size, bad)
