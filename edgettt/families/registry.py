"""The families edgettt reads, each found by its config.json's `model_type` (or a model's config).

Adding a family: its folder under `families/` (config, model, conversion, checkpoint check, kernel hookup, its
state layers' roles and calibration observer) ending in a `FAMILY`, and one line in `FAMILIES` below.
"""

from __future__ import annotations

from edgettt.errors import EdgetttError
from edgettt.families.deltanet import FAMILY as DELTANET
from edgettt.families.family import Family
from edgettt.families.lact import FAMILY as LACT
from edgettt.families.ttt import FAMILY as TTT

FAMILIES: tuple[Family, ...] = (TTT, LACT, DELTANET)


def family_for_type(model_type: str | None, source="config.json") -> Family:
    """The family of a config.json's `model_type`. A config.json that names none is read as TTT's (whose
    loader then says what it lacks)."""
    if model_type is None:
        return TTT
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    known = [repr(t) for f in FAMILIES for t in f.model_types]
    raise EdgetttError(f"{source}: model_type is {model_type!r}; edgettt reads models of type "
                       f"{', '.join(known[:-1])} or {known[-1]}")


def family_of(config, missing_ok: bool = False) -> Family | None:
    """The family a loaded model's config belongs to; with `missing_ok`, None for a model of no family (the
    benchmark's reference Llama, which `edgettt.prepare` also takes)."""
    family = next((f for f in FAMILIES if isinstance(config, f.config_class)), None)
    if family is None and not missing_ok:
        raise EdgetttError(f"{type(config).__name__}: not the config of a family edgettt reads "
                           f"({', '.join(f.name for f in FAMILIES)})")
    return family


def creator_of(kind: str):
    """(family, its `Creator`) of a `create --family` kind."""
    for family in FAMILIES:
        if family.creator is not None and kind in family.creator.kinds:
            return family, family.creator
    raise EdgetttError(f"--family {kind!r}: not a kind edgettt creates ({', '.join(create_kinds())})")


def create_kinds() -> list[str]:
    return [kind for f in FAMILIES if f.creator is not None for kind in f.creator.kinds]


def create_settings() -> dict:
    """Every `create --set` key with a default of its type (the union over the kinds)."""
    return {k: v for f in FAMILIES if f.creator is not None for d in f.creator.defaults.values() for k, v in d.items()}


def preset_names() -> list[str]:
    names = [n for f in FAMILIES if f.creator is not None for p in f.creator.presets.values() for n in p]
    return list(dict.fromkeys(names))
