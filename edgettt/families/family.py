"""`Family`: what the pipeline (loading, conversion, calibration, quantization, export, the CLI) asks of a
model family. Each family's folder makes one (`families/<name>/__init__.py`, `FAMILY`) and
`families/__init__.py` lists it; nothing outside the folder asks which family a model is.

The model and config classes carry the rest of the interface: a config's `family`, `form`, `summary()` and
`size_line()` (what `info` shows) and `validate`; a model's `state_layers()`, `init_state`, `state_roles()`
(each state tensor's role: `formats.roles`) and `state_format_refusal`; a state layer's
`calibration_observer` (what `calibrate` records of its state along the text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def same_form(form: str) -> str:
    return form


@dataclass(frozen=True)
class Creator:
    """What `edgettt create --family KIND` builds for a family, with random weights: a small byte-level model sized
    by `--set`, or a published size (`--preset`, for speed and size, not text)."""

    kinds: tuple[str, ...]  # its `--family` names
    defaults: dict[str, dict]  # by kind: the `--set` keys with their defaults (a small byte-level model; None: the
                               # family's rule)
    presets: dict[str, dict[str, dict]]  # by kind: published sizes by name
    preset_vocab: int  # the vocabulary of a published size
    config: Callable  # (kind, sizes) -> the config (validated, memory checked)
    random_model: Callable  # (config, seed) -> the model


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # the config.json `model_type`s it reads
    config_class: type  # `.load(config.json path)`: checked, nothing built
    model_class: type  # `model_class(config)`: a `families.base.LanguageModel`
    check_sizes: Callable  # (config, weights header, config.json path): refuses a config its weights disagree with
    convert: Callable  # (model, form, decay, copy) -> the model in linear-attention form `form`
    kernel_layers: Callable[[], dict]  # {plain layer class: its Triton kernel subclass} (`edgettt.prepare`)
    exportable_forms: tuple[str, ...] = ("parallel",)  # forms with a parallel prefill graph
    form_converted_to: Callable[[str], str] = same_form  # the form `convert --form FORM` gives (LaCT: exact -> lact)
    export_refusal: Callable = lambda config: None  # why a config cannot be exported (beyond its form), else None
    foreign_checkpoint: Callable = lambda path: None  # a checkpoint file of another layout at `path` (ttt-lm-jax)
    load_foreign: Callable | None = None  # that file -> (config, weights, the file)
    compiled_decode: Callable | None = None  # (model, token_kernel): its layers as a compiled decode step takes them
    source_card: Callable | None = None  # config -> MODEL_CARD.md of weights that came from elsewhere
    creator: Creator | None = None  # `edgettt create`
