"""DeltaNet's `convert`: the model is a linear attention already (the delta rule's chunked form for a prefill, its
recurrence for a decode step), so every form asked for is its own computation, as a copy."""

from __future__ import annotations

import copy as copying

from edgettt.errors import EdgetttError
from edgettt.families.deltanet.model import DeltaRuleForCausalLM


def own_form(form: str) -> str:
    """The form `convert --form FORM` gives: the model's own ("parallel") for "exact" and "parallel"."""
    return "parallel"


def convert(model: DeltaRuleForCausalLM, form: str = "exact", decay: float | None = None, copy: bool = True):
    if decay is not None:
        raise EdgetttError(f"decay is for TTT's parallel form; a {model.config.family} model decays by its own gates")
    if form not in ("exact", "parallel"):
        raise EdgetttError(f"form {form!r} is not one of 'exact', 'parallel'")
    return copying.deepcopy(model) if copy else model
