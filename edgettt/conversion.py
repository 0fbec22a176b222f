"""`convert`: a model in another form of its family (DESIGN section 4), through its family's conversion
(`families/<name>/conversion.py`)."""

from __future__ import annotations

from edgettt.families.base import LanguageModel
from edgettt.families.registry import family_of


def convert(model: LanguageModel, form: str = "exact", decay: float | None = None, copy: bool = True) -> LanguageModel:
    """A new model in linear-attention form `form` ("exact" or "parallel") with the same weights; with `decay`
    (0 < decay < 1, TTT's form "parallel"), a decayed parallel form starting at that gamma. With `copy=False` the
    new model may share the weights' memory with `model` (which is then not to be used: for converting a model
    too large to hold twice). The new model remembers the precision `model`'s file stored (bfloat16 in,
    bfloat16 out)."""
    converted = family_of(model.config).convert(model, form, decay, copy)
    converted.stored_dtype = getattr(model, "stored_dtype", None)
    return converted
