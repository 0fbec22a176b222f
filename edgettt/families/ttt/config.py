"""Model configuration: the ttt-lm-pytorch `config.json` keys (DESIGN 3.1) and edgettt's additions.

One dataclass serves both the original TTT checkpoints and edgettt's converted models. A converted
model's config.json carries the same keys plus `edgettt_format` and `form`, so the numbers that
define the architecture are written once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from edgettt.errors import EdgetttError
from edgettt.families.config_file import (check_fits_memory, check_sizes_and_scalars, check_switches,
                                           read_config_object)

TTT_MODEL_TYPE = "ttt"
CONVERTED_MODEL_TYPE = "edgettt-linear-attention"
FORMAT_VERSION = 1
FORMS = ("ttt", "exact", "parallel")  # "ttt" = the original mini-batch TTT computation
# Upper bounds of the size keys: far above any published TTT model (the largest, 1.3B, has hidden 2048
# and 24 layers), low enough that a typo is refused before it allocates anything.
# The published ttt-lm-pytorch model sizes (its TTT_STANDARD_CONFIGS), with the Llama tokenizer's
# vocabulary: `edgettt create --preset NAME` builds them with random weights (for speed and size,
# which do not depend on the values).
PRESETS = {
    "125m": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 2048},
    "350m": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 2736},
    "760m": {"hidden_size": 1536, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
    "1b": {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32, "intermediate_size": 5504},
}
PRESET_VOCAB = 32000

SIZE_LIMITS = {"vocab_size": 2**22, "hidden_size": 2**16, "intermediate_size": 2**18, "num_hidden_layers": 1024,
               "num_attention_heads": 1024, "mini_batch_size": 2**16, "conv_kernel": 1024}


CONVERTED_ONLY = ("extra", "form", "quantization", "state_decay")  # fields config.json holds only for edgettt's models


@dataclasses.dataclass
class ModelConfig:
    vocab_size: int = 32000
    hidden_size: int = 2048
    intermediate_size: int = 5504
    num_hidden_layers: int = 24
    num_attention_heads: int = 32
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    use_gate: bool = False
    share_qk: bool = False
    ttt_layer_type: str = "linear"
    ttt_base_lr: float = 1.0
    mini_batch_size: int = 16
    pre_conv: bool = False
    conv_kernel: int = 4
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    # edgettt's own: which computation the weights are laid out for
    form: str = "ttt"
    # a decayed parallel form: each layer's state decays towards its initial state at every commit
    # (a learned gamma a head, `linear_attention.Decay`)
    state_decay: bool = False
    # a quantized model: its QuantConfig as a dict (see quant/config.py)
    quantization: dict | None = None
    # keys we do not use, kept so that a round trip loses nothing
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def family(self) -> str:
        return "ttt-" + self.ttt_layer_type

    def summary(self) -> dict:
        """The sizes and switches `info` reports beside every family's common ones."""
        return {"intermediate_size": self.intermediate_size, "heads": self.num_attention_heads,
                "head_dim": self.head_dim, "mini_batch_size": self.mini_batch_size,
                "options": {k: getattr(self, k) for k in ("share_qk", "pre_conv", "use_gate", "tie_word_embeddings")}}

    def size_line(self) -> str:
        """The same, in `info`'s words."""
        return (f"intermediate {self.intermediate_size}, {self.num_attention_heads} heads of {self.head_dim}, "
                f"mini-batch {self.mini_batch_size}")

    @property
    def inner_dim(self) -> int:
        """Width of the first fast-weight level: d for TTT-Linear, 4d for TTT-MLP."""
        return self.head_dim * (4 if self.ttt_layer_type == "mlp" else 1)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        model_type = raw.get("model_type")
        if model_type not in (TTT_MODEL_TYPE, CONVERTED_MODEL_TYPE):
            raise EdgetttError(
                f"{source}: model_type is {model_type!r}, expected 'ttt' (a ttt-lm-pytorch checkpoint) "
                f"or '{CONVERTED_MODEL_TYPE}' (an edgettt model)"
            )
        names = {f.name for f in dataclasses.fields(cls)} - set(CONVERTED_ONLY)
        known = {k: v for k, v in raw.items() if k in names}
        extra = {k: v for k, v in raw.items()
                 if k not in names and k not in ("model_type", "form", "edgettt_format", "state_decay")}
        form = "ttt"
        if model_type == CONVERTED_MODEL_TYPE:
            version = raw.get("edgettt_format")
            if version != FORMAT_VERSION:
                raise EdgetttError(
                    f"{source}: edgettt_format is {version!r}, this edgettt reads version {FORMAT_VERSION}; "
                    "convert the original checkpoint again"
                )
            form = raw.get("form")
            if form not in ("exact", "parallel"):
                raise EdgetttError(f"{source}: form is {form!r}, expected 'exact' or 'parallel'; convert the original again")
        quantization = raw.get("quantization") if form != "ttt" else None
        extra.pop("quantization", None)
        state_decay = raw.get("state_decay", False) if form != "ttt" else False
        config = cls(**known, form=form, extra=extra, quantization=quantization, state_decay=state_decay)
        config.validate(source)
        return config

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.extra)
        out.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in CONVERTED_ONLY})
        if self.form == "ttt":
            out["model_type"] = TTT_MODEL_TYPE
        else:
            out.update(model_type=CONVERTED_MODEL_TYPE, edgettt_format=FORMAT_VERSION, form=self.form)
            if self.quantization:
                out["quantization"] = self.quantization
            if self.state_decay:
                out["state_decay"] = True
        return out

    def validate(self, source: str = "config.json") -> None:
        """Types and ranges of every key, before anything is built from them (a config.json is input)."""
        def bad(what: str) -> EdgetttError:
            return EdgetttError(f"{source}: {what}; fix the config")

        check_sizes_and_scalars(self, SIZE_LIMITS, ("rms_norm_eps", "rope_theta", "ttt_base_lr"), bad)
        check_switches(self, ("tie_word_embeddings", "use_gate", "share_qk", "pre_conv", "state_decay"), bad)
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise bad(f"{key} must be a non-negative integer or null, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise bad(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                      f"{self.num_attention_heads}")
        if self.head_dim % 2:
            raise bad(f"head dim {self.head_dim} is odd; rotary embedding needs an even head dim")
        if self.ttt_layer_type not in ("linear", "mlp"):
            raise bad(f"ttt_layer_type is {self.ttt_layer_type!r}, expected 'linear' or 'mlp'")
        if self.hidden_act != "silu":
            raise bad(f"hidden_act {self.hidden_act!r} is not supported (only 'silu')")
        if self.form not in FORMS:
            raise bad(f"form {self.form!r} is not one of {FORMS}")
        if self.state_decay and self.form != "parallel":
            raise bad(f"state_decay is for the parallel form, not form {self.form!r}")
        distilled = self.extra.get("distilled_ctx")
        if distilled is not None and (not isinstance(distilled, int) or isinstance(distilled, bool) or distilled < 1):
            raise bad(f"distilled_ctx must be a positive integer, got {distilled!r}")
        if self.quantization is not None and not isinstance(self.quantization, dict):
            raise bad(f"quantization must be an object, got {self.quantization!r}")

    def estimated_parameters(self) -> int:
        """Parameters of a model of this config, near enough to refuse one that cannot fit in memory."""
        C, L, d = self.hidden_size, self.num_hidden_layers, self.head_dim
        embed = self.vocab_size * C * (1 if self.tie_word_embeddings else 2)
        inner = self.num_attention_heads * d * self.inner_dim * (2 if self.ttt_layer_type == "mlp" else 1)
        return embed + L * (5 * C * C + 3 * C * self.intermediate_size + inner)

    def check_memory(self, source: str = "config.json") -> None:
        """Refuse, before allocating, a model whose float32 weights would not fit in this machine's memory."""
        check_fits_memory(4 * self.estimated_parameters(), source)

    @classmethod
    def load(cls, path: Path) -> "ModelConfig":
        return cls.from_dict(read_config_object(path), source=str(path))
