"""Size on disk and ONNX Runtime CPU speed of an exported model (the ONNX rows of `edgettt report`).

Batch 1, onnxruntime's default threads: prefill tokens/s over a prompt of `prompt` tokens, decode
tokens/s over `steps` single-token steps after it; each the median of `repeats` runs after a warm-up.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..model import CausalLM


def onnx_speed(model: CausalLM, prompt: int = 256, steps: int = 256, repeats: int = 5, seed: int = 0) -> dict:
    from ..runner import Runner
    from . import DEFAULT_OPSET, export_graphs, manifest, write_manifest

    with tempfile.TemporaryDirectory(prefix="edgettt-onnx-") as tmp:
        directory = Path(tmp)
        io = export_graphs(model, directory)
        write_manifest(directory, manifest(model, "speed", io, DEFAULT_OPSET))
        runner = Runner(directory)
        ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, (1, prompt + steps))

        def prefill():
            return runner.run_prefill(ids[:, :prompt])

        def decode():
            _, states = prefill_out
            for t in range(prompt, prompt + steps):
                _, states = runner.run_decode(ids[:, t], t, states)

        prefill_out = prefill()  # warm-up, and the states decode starts from
        decode()
        prefill_s = statistics.median(_seconds(prefill) for _ in range(repeats))
        decode_s = statistics.median(_seconds(decode) for _ in range(repeats))
        return {"onnx_prefill_mb": (directory / "prefill.onnx").stat().st_size / 1e6,
                "onnx_decode_mb": (directory / "decode.onnx").stat().st_size / 1e6,
                "ort_prefill_tokens_per_s": prompt / prefill_s, "ort_decode_tokens_per_s": steps / decode_s,
                "ort_prompt_tokens": prompt, "ort_decode_steps": steps}


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
