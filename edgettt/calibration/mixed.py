"""Mixed precision by budget (DESIGN section 5.3): each layer's format chosen so that the model meets a size
or a drift budget with the least drift or the fewest bytes.

    plan = search_mix(model, calibration, text, Budget.parse("size=2.5"))
    quantize_model(model, plan.config())

1. Sensitivity: every quantizable layer (lm_head too) is quantized alone in each candidate variant
   (`CANDIDATES`: int4 in groups of 128 / 64 / 32, int6 in groups of 128 / 64 and int8, by GPTQ where the
   calibration holds the layer's input statistics), the rest of the model left in float, and its KLD against the
   float model measured on `tokens` of the calibration text for its coarsest variant, the others scaled from it
   by their output errors (`sensitivities`). Its bytes are those the format stores.
2. Choice: the drift of a mix is taken as the sum of its layers' drifts (first order, measured against the
   mix itself afterwards), so the best mix for every size is a multiple-choice knapsack, solved exactly by
   dynamic programming over the bytes: the frontier, minimum predicted KLD for each size. A size budget takes
   its point; a KLD budget the smallest size whose predicted KLD is within it (tightened and tried again
   while the measured KLD of the chosen mix is above it).
3. The chosen mix is a QuantConfig whose `overrides` name each layer's variant; `quantize_model` makes it,
   saved and loaded as any quantized model (each QuantLinear keeps its own group size).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import torch
from torch import nn

from edgettt import metrics
from edgettt.data import Text, read_text, token_windows
from edgettt.errors import EdgetttError
from edgettt.evaluation import collect_logits, encode
from edgettt.progress import bar
from edgettt.quant.apply import (check_calibration_covers, quantizable_linears, quantize_layer, quantize_model, set_module,
                    tie_quantized_embedding)
from edgettt.quant.config import QuantConfig, weight_variant
from edgettt.quant.linear import QuantLinear, QuantState
from edgettt.quant.weight_formats import weight_format

CANDIDATES = ("int4-gptq-g128", "int4-gptq-g64", "int4-gptq-g32", "int6-gptq-g128", "int6-gptq-g64", "int8-gptq",
              "float")
BUDGET_KINDS = {"size": "MB of weights as stored", "kld": "mean KLD against the float model"}
RETRIES = 3  # a KLD budget: how many tighter choices are tried while the measured KLD is above it


@dataclasses.dataclass(frozen=True)
class Budget:
    kind: str  # "size" (MB) or "kld"
    value: float

    @classmethod
    def parse(cls, text: str, option: str = "--target") -> "Budget":
        kind, _, value = str(text).partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if kind not in BUDGET_KINDS or not math.isfinite(number) or number <= 0:
            raise EdgetttError(f"{option} {text!r}: expected size=MB or kld=X with a positive number "
                               "(size=2.5: at most 2.5 MB of weights; kld=0.003: mean KLD at most 0.003)")
        return cls(kind, number)

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


@dataclasses.dataclass
class MixedPlan:
    """A chosen mix: each layer's variant, what the search predicted and what the mix measured."""

    budget: Budget
    choices: dict[str, str]  # layer -> variant (CANDIDATES)
    size_mb: float  # predicted from the formats' storage; `quantize_model` makes exactly these bytes
    predicted_kld: float
    measured_kld: float
    frontier: list[tuple[float, float]]  # (MB, predicted KLD): the best mix for each size
    uniform: list[dict]  # each candidate for every layer: variant, size_mb, predicted_kld
    sensitivity: dict[str, dict[str, float]]  # layer -> variant -> KLD with that layer alone quantized
    tokens: int
    state: str = "fp32"

    def config(self) -> QuantConfig:
        return QuantConfig("int4", 64, "gptq", state=self.state, skip=(), overrides=dict(self.choices),
                           target=str(self.budget))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "budget": str(self.budget)}


def _layer_bytes(linear: nn.Linear, variant: str) -> int | None:
    """Bytes `variant` stores for the layer, None where its groups do not divide the input."""
    if variant == "float":
        return linear.weight.numel() * 4
    fmt, _, group = weight_variant(variant)
    if not weight_format(fmt).fits(linear.in_features, group):
        return None
    return QuantState(fmt, group, linear.in_features, linear.out_features).nbytes()


def layer_sizes(model: nn.Module, candidates=CANDIDATES):
    """The quantizable layers, the bytes of everything else (norms, TTT's parameters, an untied embedding)
    and each layer's bytes in each candidate that fits it: shapes only, so a model on the meta
    device (`checkpoint.skeleton`) gives the same numbers as the loaded one."""
    layers = quantizable_linears(model, QuantConfig(skip=()))
    fixed = sum(t.numel() * t.element_size() for t in model.weights().values()) \
        - sum(lin.weight.numel() * 4 for _, lin in layers)
    sizes = {name: {v: b for v in candidates if (b := _layer_bytes(lin, v)) is not None} for name, lin in layers}
    return layers, fixed, sizes


def check_size_budget(model: nn.Module, budget: Budget, candidates=CANDIDATES) -> None:
    """A one-line error for a size budget below the smallest mix `candidates` can make of `model`."""
    if budget.kind == "size":
        _, fixed, sizes = layer_sizes(model, candidates)
        _check_smallest_mix(budget, fixed, sizes, candidates)


def _check_smallest_mix(budget: Budget, fixed: int, sizes: dict, candidates) -> None:
    if budget.kind != "size":
        return
    smallest = fixed + sum(min(s.values()) for s in sizes.values())
    if budget.value * 1e6 < smallest:
        raise EdgetttError(f"--target {budget}: below the smallest mix of {', '.join(candidates)} for this model, "
                           f"{smallest / 1e6:.3f} MB; ask for at least that")


def _quantized(name: str, linear: nn.Linear, variant: str, feedback) -> QuantLinear:
    """The layer in `variant`, as `quantize_model` makes it when a mix names the variant for it."""
    fmt, _, group = weight_variant(variant)
    return quantize_layer(name, linear, fmt, group, QuantConfig(overrides={name: variant}), feedback)


def block_inputs(model: nn.Module, windows: torch.Tensor) -> list[torch.Tensor]:
    """The hidden state entering each block (and, last, leaving the last one) for each window's inputs: what a
    layer's sensitivity run starts from, so the blocks before it are not computed again."""
    ids = windows[:, :-1]
    state = model.init_state(ids.shape[0])
    h, out = model.embedding()(ids), []
    for layer, layer_state in zip(model.model.layers, state.layers):
        out.append(h)
        h = layer(h, layer_state, 0, False)
    return out + [h]


def logits_from(model: nn.Module, block: int, h: torch.Tensor) -> torch.Tensor:
    """The logits of a prefill that enters block `block` with hidden state `h` (blocks as `LanguageModel.prefill`
    calls them; block = the number of blocks: only the final norm and the head)."""
    state = model.init_state(h.shape[0])
    for layer, layer_state in zip(model.model.layers[block:], state.layers[block:]):
        h = layer(h, layer_state, 0, False)
    return model.lm_head(model.model.norm(h)).float()


def _block_of(name: str, blocks: int) -> int:
    """The block a layer belongs to ("model.layers.3.mlp.up_proj" -> 3); after the last for the head."""
    parts = name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else blocks


def output_error(linear: nn.Linear, q: QuantLinear, hessian: torch.Tensor) -> float:
    """GPTQ's own objective, the Hessian-weighted error tr(dW H dW^T): the mean squared error the quantized
    weight adds to the layer's outputs on the calibration's inputs."""
    dw = q.dequantized().float() - linear.weight.detach().float().cpu()
    return torch.einsum("nk,kl,nl->", dw, hessian.float(), dw).item()


@torch.no_grad()
def sensitivities(model: nn.Module, calibration, windows: torch.Tensor, ref: torch.Tensor, candidates=CANDIDATES,
                  desc: str = "sensitivity") -> dict[str, dict[str, float]]:
    """layer -> variant -> mean KLD on `windows` against the float model's logits `ref` with that layer alone in
    the variant (float: 0). Measured for the layer's coarsest variant (each run starts at the layer's block from
    the float model's hidden state); the others scaled from it by their output errors (`output_error`; measured
    each, they were within 6% of that on ttt-linear-tiny-parallel). A layer without input statistics (lm_head)
    is measured in every variant."""
    model = model.to(ref.device).eval()
    inputs = block_inputs(model, windows)
    embed_name = model.EMBEDDING_KEY.rsplit(".", 1)[0]
    embedding = model.get_submodule(embed_name)

    def measured(name: str, linear: nn.Linear, q: QuantLinear) -> float:
        set_module(model, name, q)
        tie_quantized_embedding(model)  # (lm_head quantized: the tied embedding reads its rows)
        try:
            if name == "lm_head" and model.config.tie_word_embeddings:  # its rows are also the input embedding
                logits = model(windows[:, :-1]).float()
            else:
                block = _block_of(name, len(model.model.layers))
                logits = logits_from(model, block, inputs[block])
            return metrics.kld(ref, logits).mean().item()
        finally:
            set_module(model, name, linear)
            set_module(model, embed_name, embedding)

    table = {}
    for name, linear in bar(quantizable_linears(model, QuantConfig(skip=())), desc=desc, unit="layer"):
        hessian = calibration.hessians.get(name)
        variants = [v for v in candidates if v != "float" and _layer_bytes(linear, v) is not None]
        quantized = {v: _quantized(name, linear, v, calibration.feedback(name)) for v in variants}
        table[name] = {"float": 0.0}
        if hessian is None:
            table[name].update({v: measured(name, linear, q) for v, q in quantized.items()})
            continue
        errors = {v: output_error(linear, q, hessian) for v, q in quantized.items()}
        anchor = max(errors, key=errors.get)
        kld = measured(name, linear, quantized[anchor])
        table[name].update({v: kld * e / errors[anchor] if errors[anchor] > 0 else 0.0 for v, e in errors.items()})
    return table


def frontier(options: list[list[tuple[int, float]]], unit: int):
    """Multiple-choice knapsack by dynamic programming over bytes in steps of `unit` (each choice's bytes rounded
    up): `options[i]` is layer i's (bytes, KLD) choices. Returns (least summed KLD within each number of units,
    a function giving the choice indices of the best mix within a number of units)."""
    units = [[-(-n_bytes // unit) for n_bytes, _ in opts] for opts in options]
    cap = sum(max(u) for u in units)
    best = np.full(cap + 1, np.inf)
    best[0] = 0.0
    picks = []
    for opts, us in zip(options, units):
        new, pick = np.full(cap + 1, np.inf), np.zeros(cap + 1, dtype=np.int64)
        for j, ((_, kld), u) in enumerate(zip(opts, us)):
            shifted = np.full(cap + 1, np.inf)
            shifted[u:] = best[:cap + 1 - u] + kld
            better = shifted < new
            new[better], pick[better] = shifted[better], j
        picks.append(pick)
        best = new

    def choices(slot: int) -> list[int]:
        at = int(np.argmin(best[:slot + 1]))  # the best mix of at most `slot` units
        out = []
        for pick, us in zip(reversed(picks), reversed(units)):
            out.append(int(pick[at]))
            at -= us[out[-1]]
        return out[::-1]
    return np.minimum.accumulate(best), choices


def search_mix(model: nn.Module, calibration, text: Text, budget: Budget, state: str = "fp32",
               candidates=CANDIDATES, tokens: int = 2048, log=print) -> MixedPlan:
    """The mix of `candidates` that meets `budget` with the least drift (size) or the fewest bytes (kld), on a
    converted, unquantized `model` and its calibration (GPTQ's statistics). One-line errors, before the
    sensitivity work, for a size below the smallest mix; after it, for a KLD no mix meets."""
    if model.form == "ttt" or model.config.quantization:
        raise EdgetttError("a mixed-precision plan needs a converted, unquantized model")
    check_calibration_covers(calibration, model, QuantConfig("int4", 64, "gptq", state=state, skip=("lm_head",)))
    layers, fixed, sizes = layer_sizes(model, candidates)
    _check_smallest_mix(budget, fixed, sizes, candidates)
    seq_len = calibration.seq_len
    windows = token_windows(encode(model, text), seq_len)[:max(1, tokens // seq_len)]
    ref = collect_logits(model, windows, desc="float")
    table = sensitivities(model, calibration, windows, ref, candidates)
    names = [name for name, _ in layers]
    options = [[(sizes[n][v], table[n][v]) for v in sizes[n]] for n in names]
    unit = max(1, sum(max(s.values()) for s in sizes.values()) // 20000)
    least, choices_at = frontier(options, unit)
    size_axis = fixed + np.arange(len(least)) * unit
    uniform = [{"variant": v, "size_mb": (fixed + sum(sizes[n][v] for n in names)) / 1e6,
                "predicted_kld": sum(table[n][v] for n in names)}
               for v in candidates if all(v in sizes[n] for n in names)]

    corners = _pareto([(float(s) / 1e6, float(k)) for s, k in zip(size_axis, least) if np.isfinite(k)])

    def plan_at(slot: int) -> MixedPlan:
        picked = choices_at(slot)
        choices = {n: list(sizes[n])[j] for n, j in zip(names, picked)}
        size = fixed + sum(sizes[n][choices[n]] for n in names)
        return MixedPlan(budget, choices, size / 1e6, sum(table[n][choices[n]] for n in names), math.nan,
                         corners, uniform, table, int(windows[:, 1:].numel()), state)

    if budget.kind == "size":
        plan = plan_at(int(np.searchsorted(size_axis, budget.value * 1e6, side="right")) - 1)
        plan.measured_kld = _measured(model, plan, calibration, windows, ref)
        return plan
    aim, tried = budget.value, []
    for _ in range(RETRIES):
        within = np.nonzero(least <= aim)[0]
        plan = plan_at(int(within[0]))
        plan.measured_kld = _measured(model, plan, calibration, windows, ref)
        tried.append(plan.measured_kld)
        if plan.measured_kld <= budget.value:
            return plan
        aim *= 0.9 * budget.value / plan.measured_kld
        log(f"  mix of {plan.size_mb:.3f} MB measured KLD {plan.measured_kld:.3g} > {budget.value:g}: tightening")
    raise EdgetttError(f"--target {budget}: no mix found within it; the smallest KLD measured was {min(tried):.3g} "
                       f"(float weights: 0); ask for a larger KLD or a size")


def search_mix_on_calibration_text(model: nn.Module, calibration, budget: Budget, state: str = "fp32",
                                   source: str = "calibration", log=print) -> MixedPlan:
    """`search_mix` on the text `calibration` was made on (`quantize --target`), read again and checked to be the
    same text by its fingerprint (a one-line error naming `source`, the calibration file, where it cannot be); the
    plan's lines to `log`: each candidate for every layer, and the mix."""
    name = calibration.text["name"]
    text = read_text(name) if name != "stdin" else None
    if text is None or text.fingerprint()["sha256"] != calibration.text["sha256"]:
        raise EdgetttError(f"{source}: its text {name} cannot be read as it was (sha256 "
                           f"{calibration.text['sha256']}); --target measures on the calibration's text, calibrate again")
    plan = search_mix(model, calibration, text, budget, state=state, log=log)
    for row in plan.uniform:
        log(f"  every layer {row['variant']:16s} {row['size_mb']:8.3f} MB  predicted KLD {row['predicted_kld']:.5f}")
    log(f"  mix for {budget}: {plan.size_mb:.3f} MB, predicted KLD {plan.predicted_kld:.5f}, measured "
        f"{plan.measured_kld:.5f} on {plan.tokens} tokens of {text.name}")
    return plan


def _pareto(points: list[tuple[float, float]], step: float = 0.99) -> list[tuple[float, float]]:
    """The frontier's corners: each point where the least KLD has fallen below `step` of the last one kept (a few
    hundred points for a plot, not one a byte step)."""
    out = []
    for size, kld in points:
        if not out or kld < step * out[-1][1]:
            out.append((size, kld))
    return out


def _measured(model: nn.Module, plan: MixedPlan, calibration, windows: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean KLD of the mix against the float model's logits `ref` on the sensitivity windows (the sum was a
    prediction)."""
    mixed = copy.deepcopy(model)
    quantize_model(mixed, dataclasses.replace(plan, state="fp32").config(), calibration)
    return metrics.kld(ref, collect_logits(mixed, windows, desc="mix")).mean().item()
