"""`QuantConfig`: what a quantized model was made with; saved in its config.json (`quantization`)."""

from __future__ import annotations

import dataclasses

from edgettt.errors import EdgetttError
from edgettt.formats.state_formats import RENAMED, STATE_FORMATS
from edgettt.quant.weight_formats import METHODS, WEIGHT_FORMATS, weight_format

DEFAULT_SKIP = ("lm_head",)  # always kept in float unless asked otherwise; --skip adds to it
GROUP_SIZES = (32, 64, 128)
# lm_head (and a tied embedding, which reads its rows) beside 4-bit weights: 8 bits unless asked otherwise, as
# llama.cpp's Q4_K_M keeps its output and embedding tensors above the 4 bits of the rest
FOUR_BIT_FORMATS = ("int4", "nf4", "fp4")
HEAD_FORMATS = ("float", "int8", "same")  # same: the format of the other layers
FALLBACKS = ("int8", "float", "refuse")  # for a layer the asked format cannot take (llama.cpp's fallback types)


@dataclasses.dataclass
class QuantConfig:
    weights: str = "int8"  # a name in WEIGHT_FORMATS, or none
    group_size: int = 64
    method: str = "rtn"
    state: str = "fp32"  # a name in STATE_FORMATS: fp32, fp16, int12, int8, int8-tensor
    skip: tuple[str, ...] = DEFAULT_SKIP  # fnmatch patterns of module names left in float
    fallback: str = "int8"  # the format of a layer `weights` cannot take (int4/nf4/fp4: K not a multiple of the group)
    # layer -> format it gets instead of `weights`: asked (lm_head's int8), a fallback (filled by quantize_), or
    # a mixed-precision plan's choice spelt as a variant (int4-gptq-g32: format, method and group; `override`)
    overrides: dict = dataclasses.field(default_factory=dict)
    target: str = ""  # the budget a mixed-precision plan was chosen for (size=MB or kld=X; `calibration.mixed`), if any

    def __post_init__(self):
        self.state = RENAMED.get(self.state, self.state)  # an old name (int8-calibrated) as today's
        if self.fallback not in FALLBACKS:
            raise EdgetttError(f"--fallback {self.fallback!r}: expected one of {', '.join(FALLBACKS)}")
        if not isinstance(self.overrides, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and (v in (*WEIGHT_FORMATS, "float") or v in weight_variants())
                for k, v in self.overrides.items()):
            raise EdgetttError(f"overrides {self.overrides!r}: expected layer names with their formats")
        if not isinstance(self.target, str):
            raise EdgetttError(f"target {self.target!r}: expected a budget such as size=2.5 or kld=0.003")
        if isinstance(self.skip, str) or not all(isinstance(p, str) for p in self.skip):
            raise EdgetttError(f"--skip {self.skip!r}: expected name patterns")
        self.skip = tuple(self.skip)
        if self.group_size not in GROUP_SIZES or isinstance(self.group_size, bool):
            raise EdgetttError(f"--group-size {self.group_size!r}: expected one of {', '.join(map(str, GROUP_SIZES))}")
        if self.weights not in (*WEIGHT_FORMATS, "none"):
            raise EdgetttError(f"--weights {self.weights!r}: expected one of {', '.join(WEIGHT_FORMATS)}, none")
        if self.method not in METHODS:
            raise EdgetttError(f"--method {self.method!r}: expected one of {', '.join(METHODS)}")
        if self.state not in STATE_FORMATS:
            raise EdgetttError(f"--state {self.state!r}: expected one of {', '.join(STATE_FORMATS)}")
        if self.method not in (weight_format(self.weights).methods if self.weights != "none" else ("rtn",)):
            takers = [name for name, f in WEIGHT_FORMATS.items() if self.method in f.methods]
            raise EdgetttError(f"--method {self.method} applies to --weights {', '.join(takers[:-1])} and {takers[-1]} "
                               "only")

    @property
    def variant(self) -> str:
        """The weights' one spelling, FORMAT[-METHOD][-gGROUP | -bBLOCK]: int4-gptq-g64, int8, nf4-b64, float."""
        if self.target:
            return f"mix-{self.target}"
        return "float" if self.weights == "none" else weight_format(self.weights).label(self.method, self.group_size)

    def override(self, name: str) -> tuple[str, str, int] | None:
        """(format, method, group) asked for layer `name`, or None. A bare format name keeps the config's group
        and rounds to nearest (lm_head's int8, a fallback); a variant spelling names all three (a mix's
        int4-gptq-g32); "float" leaves the layer as it is."""
        asked = self.overrides.get(name)
        if asked is None:
            return None
        if asked == "float" or asked in WEIGHT_FORMATS:
            return asked, "rtn", self.group_size
        return weight_variant(asked, f"overrides[{name}]")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "skip": list(self.skip), "overrides": dict(self.overrides),
                "variant": self.variant}

    def fits(self, in_features: int) -> bool:
        """Whether `weights` can take a layer of this input size (groups and blocks along the input)."""
        return self.weights == "none" or weight_format(self.weights).fits(in_features, self.group_size)

    def needs_calibration(self) -> bool:
        """GPTQ reads the layers' input statistics, a calibrated state format its scales."""
        return self.method == "gptq" or STATE_FORMATS[self.state].needs_calibration

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "QuantConfig":
        """From a config.json's `quantization`: the same checks as the command line, named by file."""
        try:
            return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})
        except (EdgetttError, TypeError) as exc:
            raise EdgetttError(f"{source}: quantization is malformed ({str(exc).split(':')[0]}: "
                               f"{raw}); quantize the model again") from None


def default_head_format(weights: str) -> str:
    """lm_head's format when none is asked: int8 beside 4-bit weights, else float."""
    return "int8" if weights in FOUR_BIT_FORMATS else "float"


def weight_variants() -> dict[str, tuple[str, str, int]]:
    """Every spelling of a weight variant -> (format, method, group size). A variant's name is its
    format's label (`WeightFormat.label`: int4-gptq-g64, int8-gptq, nf4-b64, bnb-int8); the parts a
    name leaves out take their defaults, rtn and 64 (int4 is int4-rtn-g64, int4-gptq is int4-gptq-g64)."""
    spellings = {"float": ("none", "rtn", 64), "none": ("none", "rtn", 64)}
    for name, fmt in WEIGHT_FORMATS.items():
        for method in fmt.methods:
            for group in (GROUP_SIZES if fmt.grouped else (64,)):
                spellings[fmt.label(method, group)] = (name, method, group)
        spellings.setdefault(name, (name, "rtn", 64))
        for method in fmt.methods if len(fmt.methods) > 1 else ():
            spellings.setdefault(f"{name}-{method}", (name, method, 64))
    return spellings


def weight_variant(text: str, option: str = "--weights") -> tuple[str, str, int]:
    """(format, method, group size) of a variant's name; a one-line error lists the names."""
    spellings = weight_variants()
    if text not in spellings:
        canonical = [k for k, (fmt, method, group) in spellings.items()
                     if k == QuantConfig(fmt, group, method).variant]
        raise EdgetttError(f"{option}: unknown weight variant {text!r}; use FORMAT[-METHOD][-gGROUP]: "
                           f"{', '.join(canonical)}")
    return spellings[text]
