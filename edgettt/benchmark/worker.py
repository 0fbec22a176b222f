"""A worker process of `edgettt bench`: it builds one engine, then times tests as the parent asks. It
imports its engine's module alone (`plan.ENGINES`), so that a worker timing an export on the CPU runs
without torch and its peak resident memory is its own."""

from __future__ import annotations

import importlib
import os
import time

import numpy as np

from edgettt.benchmark.plan import ENGINES, CudaOptions, Test, engine_name, warm_up_test


def make_engine(path: str, threads: int | None, device: str, cuda: CudaOptions | None):
    """The engine that times `path`: on CUDA `cuda.CudaEngine`, else the one for the kind of path."""
    module, cls = ENGINES["torch cuda" if device == "cuda" else engine_name(path)]
    return getattr(importlib.import_module(f".{module}", __package__), cls)(path, threads, cuda)


def time_test(engine, test: Test, rng, batch: int = 1) -> float:
    """Seconds the test's timed part takes, for `batch` sequences."""
    if test.kind == "pp":
        ids = rng.integers(0, engine.vocab, (batch, test.tokens))
        # (a CUDA graph of the prefill captured before the clock starts, and dropped after)
        captured = hasattr(engine, "ready_prefill") and engine.ready_prefill(ids)
        t0 = time.perf_counter()
        engine.prefill(ids)
        seconds = time.perf_counter() - t0
        if captured:
            engine.release()
        return seconds
    start = max(test.depth, 1)
    ids = rng.integers(0, engine.vocab, (batch, start + test.tokens))
    states = engine.prefill(ids[:, :start], room=test.tokens)  # room: tokens the decode appends (a KV cache's)
    if hasattr(engine, "ready"):  # (CUDA graphs captured before the clock starts)
        engine.ready(ids[:, start:], start, states)
    t0 = time.perf_counter()
    engine.decode(ids[:, start:], start, states)
    seconds = time.perf_counter() - t0
    if hasattr(engine, "release"):  # (the graphs' memory freed before the next test)
        engine.release()
    return seconds


def serve(conn, path: str, threads: int | None, seed: int, device: str = "cpu", batch: int = 1,
          cuda: CudaOptions | None = None, siblings: int = 1) -> None:
    """A worker process: build `path`'s engine, answer ("ready", pid) (or ("error", line)), then serve the
    parent's requests until None: ("warm", test) runs the test once, untimed (the first runs of a session
    allocate, plan, autotune and compile), answered ("warm",); ("time", test) warms up first if this worker
    has not run the test yet, then times it, answered (seconds, peak MB, pid, bytes a decode step moves or
    None, a prefill token's matmul FLOPs or None): the peak is resident memory on the CPU (the process's
    high-water mark), the GPU memory allocated during the test on CUDA; ("copy", None) measures the GPU's
    copy bandwidth, answered (bytes/s,)."""
    try:
        engine = make_engine(path, threads, device, cuda)
        if siblings > 1 and device == "cuda" and cuda is not None and cuda.compile:
            importlib.import_module(".cuda", __package__).share_compile_threads(siblings)
    except Exception as exc:  # reported to the parent as one line
        conn.send(("error", f"{path}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    rng, warmed = np.random.default_rng(seed), set()
    while (request := next_request(conn)) is not None:
        kind, test = request
        if kind == "copy":  # the ceiling the decode rows are set against, measured while the GPU is idle
            conn.send((engine.copy_bandwidth(),))
            continue
        try:
            if test not in warmed:
                time_test(engine, warm_up_test(test, device), rng, batch)
                warmed.add(test)
            if kind == "warm":
                conn.send(("warm",))
                continue
            engine.reset_peak()
            engine.step_bytes = None
            seconds = time_test(engine, test, rng, batch)
            conn.send((seconds, engine.peak_mb(), os.getpid(), engine.step_bytes,
                       getattr(engine, "prefill_flops_per_token", None)))
        except Exception as exc:
            conn.send(("error", f"{path}: {test.name} failed: {type(exc).__name__}: {exc}"))
            return


def next_request(conn):
    """The parent's next request; None when it says so or has gone (its end of the pipe closed)."""
    try:
        return conn.recv()
    except EOFError:
        return None
