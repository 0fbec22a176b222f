"""A function of one tensor recorded once as a CUDA graph and replayed.

TTT layers run a loop over mini-batches of small kernels: on a GPU their forward (and training step) is
bound by kernel launches, not by arithmetic. Recording the calls once as a CUDA graph and replaying it
removes that overhead. Used by the tiny models' training step (`recipes/train_tiny.py`) and the teacher's
forward in distillation (`distill.teacher_forward`).
"""

from __future__ import annotations

from typing import Callable

import torch


def graphed(fn: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor,
            warmup: int = 3) -> Callable[[torch.Tensor], torch.Tensor]:
    """`fn` recorded as a CUDA graph at `example`'s shape and dtype. A call copies its argument into the
    recorded input and replays: it must have that shape, and it returns the same output tensor every time,
    overwritten by the next call (clone what you keep). `fn` runs `warmup` times first on a side stream
    (allocations and kernel autotuning stay outside the recording). Raises what the capture raises."""
    static = example.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(static)

    def replay(x: torch.Tensor) -> torch.Tensor:
        static.copy_(x)
        graph.replay()
        return out
    return replay
