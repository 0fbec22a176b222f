"""`edgettt bench`: how many tokens a second a model prefills and decodes, in the manner of llama.cpp's
llama-bench (batch 1 unless --batch).

    edgettt bench exports/float exports/int4 --pp 512,4096 --tg 128 --depth 0,4096 -r 5

Each path is an export directory (timed through ONNX Runtime: the edge path), a model (a directory
or a shipped name: timed through torch), or an onnxruntime-genai model folder (a transformer with its
KV cache as users run one on the edge, timed through its Generator: the anchor). Tests:

    ppN        prefill N tokens from a fresh state
    tgN@dD     decode N tokens one at a time, after a prefill of D tokens (not timed); D = 0 starts
               after a one-token prompt (the graphs take a state, and a fresh one is a prefill's)

On the CPU every measurement runs in a fresh worker process, one at a time: it loads the model, warms
up on a short run of the same kind (the first runs of a session allocate and plan), and times the
test, so that its peak resident memory is its own and a machine holds one model's peak at a time
(workers kept alive side by side held every variant's memory arena at once: five 125m exports ran out
of 24 GiB). On CUDA each path keeps one worker for the whole run (`Workers`): a model loads, and its
steps compile, once, every worker runs every test once untimed, side by side, before the timing, and
the GPU's peak is reset before each test. The variants take turns: repetition r runs every test of every
variant before repetition r + 1, so a drift of a shared machine falls on all of them alike. Reported per
variant and test: the median tokens/s over the repetitions, the minimum and maximum, the ratio to the
first path (taken per repetition, then the median), the peak resident memory, and the size on disk (and
the decode graph's nodes, for an export). Token ids are random: speed does not depend on them.

With `--device cuda` (`CudaEngine`) models run through torch on the GPU as `edgettt.prepare` makes them
(bfloat16, the fast paths of `fast_paths.py`, the decode step compiled), decode replays CUDA graphs
(`capture_steps`) and a prefill is captured as one before it is timed; the peak is the GPU memory
allocated, and `llama:<preset>` is the same-size transformer of `benchmark.llama`, prepared alike.
`CudaOptions` turns the fast paths off one by one, for the lab's studies.

The package, each module importing what it needs at its top (a CPU worker timing an export loads
numpy and onnxruntime only, so that its peak memory is its own):

    plan.py          the tests (ppN, tgN@dD), what a path is, CudaOptions: plain Python
    worker.py        a worker process: builds its engine, answers the parent's requests
    onnx_engine.py   an export through `edgettt.runner`      (numpy, onnxruntime)
    genai_engine.py  an onnxruntime-genai folder             (onnxruntime-genai)
    torch_engine.py  a model through torch on the CPU        (torch)
    cuda.py          a model (or llama:<preset>) on a CUDA GPU, CUDA graphs, the hardware limits (torch)
    parent.py        the parent: checks, workers, the rows, the table and the JSON

The names below load on first use.
"""

import importlib

_LAZY = {**{name: "plan" for name in ("Test", "tests", "CudaOptions", "LLAMA_PREFIX", "dense_bf16_flops",
                                      "cpu_name")},
         **{name: "parent" for name in ("run", "table", "write", "footer", "count_nodes")},
         **{name: "cuda" for name in ("capture_steps", "capture_prefill", "copy_state", "linear_parameters",
                                      "state_bytes", "weight_bytes", "llama_config")}}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'edgettt.benchmark' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
