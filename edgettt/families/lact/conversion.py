"""LaCT's `convert`: form "exact" is LaCT's own chunk-recurrent computation (form "lact"), "parallel" the linear
attention of the W1-only variant (`model.converted_copy`)."""

from __future__ import annotations

from edgettt.errors import EdgetttError
from edgettt.families.lact.model import LaCTForCausalLM, converted_copy


def own_form(form: str) -> str:
    """The form `convert --form FORM` gives a LaCT model: its own computation for "exact"."""
    return "lact" if form == "exact" else form


def convert(model: LaCTForCausalLM, form: str = "exact", decay: float | None = None, copy: bool = True):
    """The same weights in form "lact" ("exact") or "parallel" (`copy` is always made: LaCT models are small)."""
    if decay is not None:
        raise EdgetttError(f"decay is for TTT's parallel form, not form {form!r} of {model.config.family}")
    if form not in ("exact", "lact", "parallel"):
        raise EdgetttError(f"form {form!r} is not one of 'exact', 'parallel'")
    return converted_copy(model, own_form(form))
