"""Timing on a CUDA GPU, shared by `edgettt bench` and the kernel benchmarks of benchmarks/: a function's
median time and the device's copy bandwidth, the ceiling a decode step's bytes are set against."""

from __future__ import annotations

import statistics

import torch
from triton.testing import do_bench, do_bench_cudagraph


def event_ms(fn) -> float:
    """One run of `fn` between CUDA events, in ms."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def time_ms(fn, budget_ms: float = 300.0, graph: bool = False) -> float:
    """Median time of `fn` in ms. With `graph`, the replays of a captured CUDA graph (no launch
    gaps: for microsecond kernels; the caller rotates inputs past L2). Otherwise fast functions go
    through triton's do_bench (L2 flushed between runs) and slow ones (the torch references) are
    timed with CUDA events, at least 3 runs."""
    fn()
    torch.cuda.synchronize()
    if graph:
        return do_bench_cudagraph(fn, rep=budget_ms, return_mode="median")
    once = event_ms(fn)
    if once < budget_ms / 20:
        return do_bench(fn, warmup=max(10.0, 5 * once), rep=budget_ms, return_mode="median")
    return statistics.median(event_ms(fn) for _ in range(max(3, min(10, int(budget_ms / once)))))


def copy_bandwidth(n_bytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written per second: the ceiling every row is set against."""
    src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * n_bytes / (ms * 1e-3)
