"""edgettt: TTT-KV language models converted to linear attention, quantized and exported for the edge.

    model = edgettt.load("path/to/checkpoint")         # original TTT or converted model, or a shipped name
    fast = edgettt.convert(model, form="parallel")      # linear-attention form
    logits = fast(input_ids)                            # [B, T, vocab]
    state = fast.init_state(batch_size)
    logits, state = fast.step(input_ids[:, t], state)   # decode over a fixed-size state
    cal = edgettt.calibrate(fast, "python-docs:train")  # one function per command: see edgettt/api.py
    q = edgettt.quantize(fast, edgettt.QuantConfig("int4", 64, "gptq"), cal)
    print(edgettt.evaluate(q, "python-docs", ref=fast).drift["kld_mean"])
    edgettt.export(q, "onnx/")                          # ONNX Runtime graphs, verified
    edgettt.save(q, "q4/")
    gpu = edgettt.prepare(edgettt.load("ttt-linear-tiny-parallel"))   # bf16 on CUDA, kernels, compiled decode
    print(edgettt.bench(["ttt-linear-tiny-parallel"], pp=[512], tg=[128])["rows"])
"""

import importlib

from edgettt.errors import EdgetttError

# Imported on first use, so that `edgettt.runner` (the edge runner) imports without torch.
_LAZY = {"load": ("checkpoint", "load_model"), "ModelConfig": ("families.ttt.config", "ModelConfig"),
         "convert": ("conversion", "convert"), "CausalLM": ("families.ttt.model", "CausalLM"), "State": ("families.base", "State"),
         "random_model": ("families.ttt.random_init", "random_model"), "QuantConfig": ("quant.config", "QuantConfig"),
         "prepare": ("fast_paths", "prepare"), "FastPaths": ("fast_paths", "FastPaths"),
         **{name: ("api", name) for name in ("calibrate", "quantize", "evaluate", "export", "report", "compare", "save",
                                        "bench", "convert_checkpoint", "quantize_checkpoint")}}

__version__ = "0.1.0"
__all__ = ["load", "convert", "ModelConfig", "CausalLM", "State", "EdgetttError", "random_model", "QuantConfig",
           "calibrate", "quantize", "evaluate", "export", "report", "compare", "save", "bench", "prepare", "FastPaths",
           "convert_checkpoint", "quantize_checkpoint"]


def __dir__() -> list[str]:
    """`dir(edgettt)` shows the API, though its names load on first use."""
    return sorted([*__all__, "__version__"])


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'edgettt' has no attribute {name!r}")
    module, attr = _LAZY[name]
    return getattr(importlib.import_module(f".{module}", __name__), attr)
