"""A model timed through torch (CausalLM.prefill and .step) on the CPU."""

from __future__ import annotations

import torch

from edgettt.checkpoint import load_model
from edgettt.benchmark.onnx_engine import OnnxEngine


class TorchEngine:
    def __init__(self, path: str, threads: int | None, options=None):
        if threads:
            torch.set_num_threads(threads)
        self.model = load_model(path).eval()
        self.vocab = self.model.config.vocab_size

    def prefill(self, ids, room: int = 0):
        with torch.no_grad():
            return self.model.prefill(torch.from_numpy(ids), logits_from=ids.shape[1] - 1)[1]

    def decode(self, ids, start, state):
        with torch.no_grad():
            for t in range(ids.shape[1]):
                _, state = self.model.step(torch.from_numpy(ids[:, t]), state)

    reset_peak, peak_mb = OnnxEngine.reset_peak, OnnxEngine.peak_mb  # resident memory, as an export's
