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

from edgettt.families.base import LanguageModel
from edgettt.onnx_files import graph_bytes
from edgettt.progress import bar
from edgettt.runner import Runner
from edgettt.onnx import write_export


def time_round(runner, ids: np.ndarray, prompt: int) -> tuple[float, float]:
    """Prefill ids[:, :prompt], then decode the rest of ids one token at a time: (prefill, decode) tokens/s."""
    t0 = time.perf_counter()
    _, states = runner.run_prefill(ids[:, :prompt], last_only=True)
    t1 = time.perf_counter()
    runner.decode_tokens(ids[:, prompt:], prompt, states)
    t2 = time.perf_counter()
    return prompt / (t1 - t0), (ids.shape[1] - prompt) / (t2 - t1)


def onnx_speed(model: LanguageModel, prompt: int = 256, steps: int = 256, repeats: int = 5, seed: int = 0,
               keep: Path | None = None) -> dict:
    """Export `model` (into `keep` when given, else a temporary folder) and time it in onnxruntime."""
    with tempfile.TemporaryDirectory(prefix="edgettt-onnx-") as tmp:
        directory = Path(tmp) if keep is None else keep
        directory.mkdir(parents=True, exist_ok=True)
        write_export(model, directory, "speed")
        runner = Runner(directory)
        ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, (1, prompt + steps))
        time_round(runner, ids[:, :prompt + 16], prompt)  # warm-up
        rounds = [time_round(runner, ids, prompt) for _ in bar(range(repeats), desc="onnxruntime speed", unit="round",
                                                                leave=False)]
        return {"onnx_prefill_mb": graph_bytes(directory / "prefill.onnx") / 1e6,  # with the weights each reads
                "onnx_decode_mb": graph_bytes(directory / "decode.onnx") / 1e6,
                "ort_prefill_tokens_per_s": statistics.median(r[0] for r in rounds),
                "ort_decode_tokens_per_s": statistics.median(r[1] for r in rounds),
                "ort_prompt_tokens": prompt, "ort_decode_steps": steps}
