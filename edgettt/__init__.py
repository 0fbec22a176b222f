"""edgettt: TTT-KV language models converted to linear attention, quantized and exported for the edge.

    model = edgettt.load("path/to/checkpoint")         # original TTT or converted model
    fast = edgettt.convert(model, form="parallel")      # linear-attention form
    logits = fast(input_ids)                            # [B, T, vocab]
    state = fast.init_state(batch_size)
    logits, state = fast.step(input_ids[:, t], state)   # decode over a fixed-size state
    fast.save("out")
"""

from .checkpoint import load_model as load
from .config import ModelConfig
from .convert import convert
from .errors import EdgetttError
from .model import CausalLM, State
from .random_init import random_model

__version__ = "0.1.0"
__all__ = ["load", "convert", "ModelConfig", "CausalLM", "State", "EdgetttError", "random_model"]
