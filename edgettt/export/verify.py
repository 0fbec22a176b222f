"""Check an export in onnxruntime against the torch model it came from (issue targets):
float graphs within relative error 1e-4 of torch's logits, quantized graphs within KLD 1e-4 of torch
running the same quantized model, and prefill-then-decode in onnxruntime equal to onnxruntime's
prefill of the whole text."""

from __future__ import annotations

import numpy as np
import torch

from ..metrics import kld, logit_error
from ..model import CausalLM

REL_ERROR_MAX = 1e-4  # float graphs, logits against torch
KLD_MAX = 1e-4  # quantized graphs


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    ref_t, got_t = torch.from_numpy(ref), torch.from_numpy(got)
    return {**logit_error(ref_t, got_t), "kld_mean": kld(ref_t, got_t).mean().item()}


def verify(model: CausalLM, directory, text, windows: int = 2, length: int | None = None) -> dict:
    """Run both graphs on `windows` windows of `text` and compare (see the module docstring)."""
    from ..evaluate import encode
    from ..runner import Runner

    b = model.config.mini_batch_size
    length = length or 4 * b + 5  # several commits and an unfinished mini-batch
    ids = torch.tensor(encode(model, text, "verify")[: windows * length]).reshape(windows, length)
    runner = Runner(directory)
    with torch.no_grad():
        ref, _ = model.float().eval().prefill(ids)
    ort_logits, _ = runner.run_prefill(ids.numpy())
    split = b + 3  # prefill a first part, decode the rest token by token
    _, states = runner.run_prefill(ids[:, :split].numpy())
    decoded, _ = runner.decode_tokens(ids[:, split:].numpy(), split, states)  # logits at positions split..
    prefill_vs_torch = compare(ref.numpy(), ort_logits)
    decode_vs_prefill = compare(ort_logits[:, split:], decoded)
    quantized = bool(model.config.quantization)
    if quantized:
        passed = prefill_vs_torch["kld_mean"] <= KLD_MAX and decode_vs_prefill["kld_mean"] <= KLD_MAX
        rule = f"KLD mean <= {KLD_MAX:g}"
    else:
        passed = prefill_vs_torch["rel_error"] < REL_ERROR_MAX and decode_vs_prefill["rel_error"] < REL_ERROR_MAX
        rule = f"relative error < {REL_ERROR_MAX:g}"
    summary = (f"prefill vs torch: rel {prefill_vs_torch['rel_error']:.2e}, KLD {prefill_vs_torch['kld_mean']:.2e}; "
               f"decode vs prefill: rel {decode_vs_prefill['rel_error']:.2e}, KLD {decode_vs_prefill['kld_mean']:.2e}")
    return {"text": text.fingerprint(), "windows": windows, "tokens": length, "decoded_from": split,
            "prefill_vs_torch": prefill_vs_torch, "decode_vs_prefill": decode_vs_prefill,
            "rule": rule, "passed": passed, "summary": summary}
