"""TTT's `convert`: a TTT checkpoint becomes a linear-attention model (DESIGN section 4).

No number changes in the exact form; the weights are only re-labelled as what they are in the
linear-attention view:
    learnable_ttt_lr_weight [H,1,C], learnable_ttt_lr_bias [H,1] -> lr_proj.weight [H,C], .bias [H]
    ttt_norm_weight, ttt_norm_bias [H,d]                        -> value_norm.weight, .bias
    W1 [H,d,D1], b1 [H,1,D1]                                    -> state0(_1) = [W1; b1]  [H,d+1,D1]
    W2 [H,D1,d], b2 [H,1,d]                                     -> state0_2   = [W2; b2]  [H,D1+1,d]
    learnable_token_idx tau [b]                                 -> mask_eta = max(0, 1/i + tau)
With `decay`, a decayed parallel form: each layer also gets decay_logit [H], every head's state
decaying towards its initial state by `decay` a mini-batch (`linear_attention.Decay`): a change of
the computation, which a distillation then tunes (each head's gamma with the rest).
"""

from __future__ import annotations

import dataclasses

import torch

from edgettt.errors import EdgetttError
from edgettt.families.ttt.converted import decay_logit
from edgettt.families.ttt.model import CausalLM
from edgettt.ops import mini_batch_etas

MIXER = "seq_modeling_block."


def convert(model: CausalLM, form: str = "exact", decay: float | None = None, copy: bool = True) -> CausalLM:
    """A new model in linear-attention form `form` ("exact" or "parallel") with the same weights; with
    `decay` (0 < decay < 1, form "parallel"), a decayed parallel form starting at that gamma. With
    `copy=False` the new model shares the weights' memory with `model` (which is then not to be used:
    for converting a model too large to hold twice)."""
    _check_decay(model, form, decay)
    if form not in ("exact", "parallel"):
        raise EdgetttError(f"form {form!r} is not one of 'exact', 'parallel'")
    source = model.weights()
    weights = source if model.form != "ttt" else _relabel(source, model.config.ttt_layer_type == "mlp")
    config = dataclasses.replace(model.config, form=form, extra=dict(model.config.extra),
                                 state_decay=model.config.state_decay or decay is not None)
    param = next(iter(source.values()))
    with torch.device("meta"):
        converted = CausalLM(config)
    if decay is not None:  # every layer's gamma starts at `decay`, replacing any the source had
        logit = decay_logit(decay)
        weights = {**weights, **{name: torch.full(p.shape, logit, dtype=param.dtype, device=param.device)
                                 for name, p in converted.named_parameters() if name.endswith(".decay_logit")}}
    converted.load_state_dict({k: v.detach().clone() if copy else v.detach() for k, v in weights.items()},
                              strict=False, assign=True)
    converted.tie_weights()
    converted.to(param.device)
    converted.tokenizer = model.tokenizer
    return converted.eval()


def _check_decay(model: CausalLM, form: str, decay: float | None) -> None:
    if getattr(model.config, "state_decay", False) and form != "parallel":
        raise EdgetttError(f"this model is a decayed parallel form; form {form!r} has no decay (convert the original)")
    if decay is None:
        return
    if form != "parallel":
        raise EdgetttError(f"decay is for TTT's parallel form, not form {form!r} of {model.config.family}")
    if not 0 < decay < 1:
        raise EdgetttError(f"decay {decay!r} is not between 0 and 1 (a mini-batch's factor, e.g. 0.97)")


def _relabel(sd: dict[str, torch.Tensor], mlp: bool) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in sd.items():
        prefix, _, leaf = name.rpartition(MIXER)
        if not prefix:
            out[name] = tensor
            continue
        p = prefix + MIXER
        if leaf == "learnable_ttt_lr_weight":
            out[p + "lr_proj.weight"] = tensor[:, 0, :]
        elif leaf == "learnable_ttt_lr_bias":
            out[p + "lr_proj.bias"] = tensor[:, 0]
        elif leaf == "ttt_norm_weight":
            out[p + "value_norm.weight"] = tensor
        elif leaf == "ttt_norm_bias":
            out[p + "value_norm.bias"] = tensor
        elif leaf == "learnable_token_idx":
            out[p + "mask_eta"] = mini_batch_etas(tensor.float())  # computed: float32 from a 16-bit file too
        elif leaf == "W1":
            out[p + ("state0_1" if mlp else "state0")] = torch.cat((tensor, sd[p + "b1"]), dim=1)
        elif leaf == "W2":
            out[p + "state0_2"] = torch.cat((tensor, sd[p + "b2"]), dim=1)
        elif leaf not in ("b1", "b2"):
            out[name] = tensor
    return out
