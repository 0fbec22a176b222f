"""What `edgettt info` reports of a model (an export's facts are the runner's: `runner.export_facts`), and a
model's size as its files store it, which info, quantize and eval give."""

from __future__ import annotations

from edgettt.checkpoint import model_directory
from edgettt.evaluation import model_facts
from edgettt.families.base import LanguageModel
from edgettt.weights_io import stored_bytes


def stored_size(model_path, weights: int) -> dict:
    """`size_mb` and `bits_per_weight` of `weights` as a model directory's files store them (a bfloat16 file:
    half the float32 it computes in); empty where no model directory's headers say (a ttt-lm-jax file, a
    tensor type edgettt does not know)."""
    directory = model_directory(model_path)
    n_bytes = stored_bytes(directory) if directory is not None else None
    if n_bytes is None or not weights:
        return {}
    return {"size_mb": n_bytes / 1e6, "bits_per_weight": 8 * n_bytes / weights}


def model_info(model: LanguageModel, model_path) -> dict:
    """Family, form, sizes, parameters and their bytes as stored, decode-state bytes and its tensors (layer 0's,
    with their roles), the context a parallel form was distilled at, a decayed form's gammas, the layers' commit
    weights."""
    c = model.config
    size = model_facts(model, str(model_path))
    size.update(stored_size(model_path, size["parameters"]))
    return {
        "path": str(model_path),
        "family": c.family,
        "form": c.form,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "layers": c.num_hidden_layers,
        **c.summary(),
        "parameters": size["parameters"],
        "weights_bytes": round(size["size_mb"] * 1e6),  # as the files store them
        "bits_per_weight": size["bits_per_weight"],
        "quantization": c.quantization,
        "decode_state_bytes_per_sequence": model.decode_state_bytes(),
        "decode_state_tensors": {k: list(t.shape[1:]) for k, t in model.init_state(1).layers[0].items()},
        "decode_state_roles": {k: r.role for k, r in model.state_roles()[0].items()},
        "tokenizer": model.tokenizer.name if model.tokenizer else None,
        "distilled_ctx": c.extra.get("distilled_ctx"),
        "state_decay": model.state_decays(),
        "commit_weights": model.commit_weights(),
    }
