"""A model folder of onnxruntime-genai (its model builder's output: genai_config.json), through its
Generator: the transformer with a KV cache that a user would run instead (the anchor of
`benchmarks/anchor_llama.py`). Prefill appends the prompt's tokens; decode appends one token a step (the
given ids, as the other engines: no sampling is timed)."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime_genai as og

from edgettt.benchmark.onnx_engine import OnnxEngine
from edgettt.benchmark.plan import GENAI_CONFIG, folder


class GenaiEngine:
    def __init__(self, path: str, threads: int | None, options=None):
        path = folder(path)  # (genai:EXPORT)
        config = og.Config(str(path))
        if threads:
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        self.model = og.Model(config)
        self.vocab = json.loads((Path(path) / GENAI_CONFIG).read_text())["model"]["vocab_size"]

    def prefill(self, ids, room: int = 0):
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=ids.shape[1] + room)  # the KV cache's length
        generator = og.Generator(self.model, params)
        generator.append_tokens(ids.astype("int32"))
        return generator

    def decode(self, ids, start, generator):
        for t in range(ids.shape[1]):
            generator.append_tokens(ids[:, t:t + 1].astype("int32"))

    reset_peak, peak_mb = OnnxEngine.reset_peak, OnnxEngine.peak_mb  # resident memory, as an export's
