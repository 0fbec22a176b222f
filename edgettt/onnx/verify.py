"""Check an export in onnxruntime against the torch model it came from.

The tolerance is what fp32 rounding of this model can explain, measured on the same tokens: torch in
float64 is the reference, and torch in float32 lands at some relative error `floor` from it; a graph
that computes the same function in fp32 lands within a small multiple of that (`ROUNDING_FACTOR`).
That holds for float weights and for int4/int8/nf4/fp4 weights, whose dequantized values are exact
fp32 numbers. Two variants are discontinuous by design and keep a KLD rule (`KLD_MAX`): an int8
state (a difference of one fp32 ulp can flip a rounding at a mini-batch commit) and LLM.int8 (torch
multiplies its outlier columns in fp16, the graph in fp32). Prefill-then-decode in onnxruntime must
equal onnxruntime's prefill of the whole text by the same rule, and onnxruntime-genai's model.onnx
(`genai`), run as genai runs it, both.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgettt.evaluation import encode, release_freed_memory
from edgettt.metrics import kld, logit_error
from edgettt.families.base import LanguageModel
from edgettt.quant.apply import set_module
from edgettt.quant.linear import QuantLinear
from edgettt.formats.state_formats import state_format
from edgettt.quant.weight_formats import WEIGHT_FORMATS
from edgettt.runner import Runner
from edgettt.onnx import genai

ROUNDING_FACTOR = 10  # two fp32 computations of one function differ by about sqrt(2) x floor; 10 leaves room
FLOOR_MIN = 1e-7  # below this the floor itself is noise of the measurement
KLD_MAX = 1e-4  # int8 state, LLM.int8
# int8 activations in ONNX Runtime's MatMulNBits (accuracy level 4): measured 4.3e-4 and 5.4e-4 on
# ttt-linear-tiny-parallel's int4 g32 and int8 exports (head quantized); a wrong graph lands near 1
KLD_MAX_INT8_ACTIVATIONS = 5e-3
# a larger model's logits move more when its activations are rounded: the limit grows with what rounding
# them in torch moves these logits (`int8_activation_noise`); an export within 10x of that is rounding, a
# wrong graph is orders of magnitude beyond it
NOISE_FACTOR = 10
INT8_ROWS_BLOCK = 32  # an int8 layer's MatMulNBits blocks (the row's scale repeated per block of 32)


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    ref_t, got_t = torch.from_numpy(ref), torch.from_numpy(got)
    return {**logit_error(ref_t, got_t), "kld_mean": kld(ref_t, got_t).mean().item()}


def verify(model: LanguageModel, directory, text, windows: int = 2, length: int | None = None) -> dict:
    """Run both graphs on `windows` windows of `text` and compare (see the module docstring)."""
    b = model.config.mini_batch_size
    chunk = getattr(model.config, "prefill_chunk", b)  # (a prefill in chunks longer than the commits: DeltaNet's)
    length = length or max(4 * b + 5, 2 * chunk + 5)  # several commits, chunks, and an unfinished one
    ids = torch.tensor(encode(model, text, "verify")[: windows * length]).reshape(windows, length)
    runner = Runner(directory)
    with torch.no_grad():
        ref, _ = model.float().eval().prefill(ids)
    ort_logits, _ = runner.run_prefill(ids.numpy())
    split = b + 3  # prefill a first part, decode the rest token by token
    first, states = runner.run_prefill(ids[:, :split].numpy())
    decoded, _ = runner.decode_tokens(ids[:, split:].numpy(), split, states)  # logits at positions split..
    prefill_vs_torch = compare(ref.numpy(), ort_logits)
    decode_vs_prefill = compare(ort_logits[:, split:], decoded)
    checks = [prefill_vs_torch, decode_vs_prefill]
    genai_vs_runner = None
    manifest = runner.manifest
    del runner  # its two sessions' weights, before genai's session prepacks its own: one set held at a time
    release_freed_memory()
    if manifest.get("genai", {}).get("written"):  # model.onnx as genai drives it: the same numbers
        genai_logits = genai.run_graph(Path(directory), manifest, ids.numpy(), split)
        genai_vs_runner = compare(np.concatenate((first, decoded), axis=1), genai_logits)
        checks.append(genai_vs_runner)
    quantization = model.config.quantization or {}
    if manifest.get("activations") == "int8":
        floor = int8_activation_noise(model, ids, ref)
        limit = max(KLD_MAX_INT8_ACTIVATIONS, NOISE_FACTOR * floor)
        passed = all(c["kld_mean"] <= limit for c in checks)
        rule = (f"KLD mean <= {limit:.2g}: int8 activations in the quantized layers, the larger of "
                f"{KLD_MAX_INT8_ACTIVATIONS:g} and {NOISE_FACTOR} x {floor:.2e} (what rounding them moves torch's "
                "logits on these tokens)")
    elif discontinuous(quantization):
        floor = None
        passed = all(c["kld_mean"] <= KLD_MAX for c in checks)
        rule = f"KLD mean <= {KLD_MAX:g} (a rounding step in the model: {quantization})"
    else:
        floor = max(fp32_rounding_floor(model, ids, ref), FLOOR_MIN)
        limit = ROUNDING_FACTOR * floor
        passed = all(c["rel_error"] < limit for c in checks)
        rule = (f"relative error < {ROUNDING_FACTOR} x {floor:.2e} (torch fp32 against fp64 on these tokens) "
                f"= {limit:.2e}")
    summary = (f"prefill vs torch: rel {prefill_vs_torch['rel_error']:.2e}, KLD {prefill_vs_torch['kld_mean']:.2e}; "
               f"decode vs prefill: rel {decode_vs_prefill['rel_error']:.2e}, KLD {decode_vs_prefill['kld_mean']:.2e}")
    if genai_vs_runner is not None:
        summary += f"; genai's graph vs both: rel {genai_vs_runner['rel_error']:.2e}, KLD {genai_vs_runner['kld_mean']:.2e}"
    return {"text": text.fingerprint(), "windows": windows, "tokens": length, "decoded_from": split,
            "prefill_vs_torch": prefill_vs_torch, "decode_vs_prefill": decode_vs_prefill,
            "genai_vs_runner": genai_vs_runner,
            "fp32_rounding_floor": floor, "rule": rule, "passed": passed, "summary": summary}


def int8_activation_noise(model: LanguageModel, ids: torch.Tensor, ref32: torch.Tensor) -> float:
    """KLD from torch's fp32 logits `ref32` to the same model's with every quantized layer's input rounded
    to int8, one scale (absmax / 127) a block along the input, as ONNX Runtime's integer MatMulNBits takes
    activations: how far int8 activations alone move this model's logits on these tokens."""
    def rounded(block: int):
        def hook(module, args):
            x = args[0]
            if x.shape[-1] % block:
                return None
            blocks = x.reshape(*x.shape[:-1], -1, block)
            scale = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
            return ((blocks / scale).round() * scale).reshape(x.shape),
        return hook

    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    hooks = [m.register_forward_pre_hook(rounded(m.group_size if m.format.grouped else INT8_ROWS_BLOCK))
             for m in layers]
    try:
        with torch.no_grad():
            noisy, _ = model.prefill(ids)
    finally:
        for h in hooks:
            h.remove()
    return kld(ref32, noisy).mean().item()


def discontinuous(quantization: dict) -> bool:
    """Whether the quantized model rounds at run time (an int8 state at every commit, LLM.int8's
    activations), so that one ulp of difference can flip a rounding: then a KLD rule, not fp32's."""
    weights = WEIGHT_FORMATS.get(quantization.get("weights"))
    return state_format(quantization.get("state", "fp32")).rounds_at_run_time or (
        weights is not None and weights.rounds_at_run_time)


def float64_copy(model: LanguageModel) -> LanguageModel:
    """The model in float64, quantized layers as plain linears holding their dequantized weights."""
    model = copy.deepcopy(model).float()
    for name, module in list(model.named_modules()):
        if isinstance(module, QuantLinear):
            linear = nn.Linear(module.in_features, module.out_features, bias=False)
            linear.weight = nn.Parameter(module.dequantized().float(), requires_grad=False)
            set_module(model, name, linear)
    return model.double()


def fp32_rounding_floor(model: LanguageModel, ids: torch.Tensor, ref32: torch.Tensor) -> float:
    """Relative error of torch's fp32 logits `ref32` against the same model in float64."""
    with torch.no_grad():
        ref64, _ = float64_copy(model).prefill(ids)
    return logit_error(ref64, ref32.double())["rel_error"]
