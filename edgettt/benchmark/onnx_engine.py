"""An export timed through `edgettt.runner.Runner` (numpy and onnxruntime, no torch)."""

from __future__ import annotations

from edgettt.runner import Runner, peak_memory_mb


class OnnxEngine:
    def __init__(self, path: str, threads: int | None, options=None):
        self.runner = Runner(path, threads)
        self.vocab = self.runner.manifest["vocab_size"]

    def prefill(self, ids, room: int = 0):
        return self.runner.run_prefill(ids, last_only=True)[1]  # as llama-bench: the next token's logits

    def decode(self, ids, start, states):
        self.runner.decode_tokens(ids, start, states)

    def reset_peak(self) -> None:
        """(The process's high-water mark cannot be reset: a worker times one test, or its peak is the run's.)"""

    def peak_mb(self) -> float:
        return peak_memory_mb()
