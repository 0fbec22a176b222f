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
allocated, and `llama:<preset>` is the same-size transformer of `edgettt.llama`, prepared alike.
`CudaOptions` turns the fast paths off one by one, for the lab's studies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import platform
import statistics
import time
from pathlib import Path

from .errors import EdgetttError
from .onnx_files import graph_bytes


@dataclasses.dataclass(frozen=True)
class Test:
    kind: str  # "pp" or "tg"
    tokens: int
    depth: int = 0

    @property
    def name(self) -> str:
        return f"pp{self.tokens}" if self.kind == "pp" else f"tg{self.tokens}@d{self.depth}"


def tests(pp: list[int], tg: list[int], depths: list[int]) -> list[Test]:
    return [Test("pp", n) for n in pp] + [Test("tg", n, d) for d in depths for n in tg]


# ---- the engines a worker times --------------------------------------------------------------------

class OnnxEngine:
    """An export through `edgettt.runner.Runner` (numpy and onnxruntime)."""

    def __init__(self, path: str, threads: int | None):
        from .runner import Runner

        self.runner = Runner(path, threads)
        self.vocab = self.runner.manifest["vocab_size"]

    def prefill(self, ids, room: int = 0):
        return self.runner.run_prefill(ids, last_only=True)[1]  # as llama-bench: the next token's logits

    def decode(self, ids, start, states):
        self.runner.decode_tokens(ids, start, states)


class TorchEngine:
    """A model through torch (CausalLM.prefill and .step), on the CPU."""

    def __init__(self, path: str, threads: int | None):
        import torch

        from . import load

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.model = load(path).eval()
        self.vocab = self.model.config.vocab_size

    def prefill(self, ids, room: int = 0):
        with self.torch.no_grad():
            return self.model.prefill(self.torch.from_numpy(ids), logits_from=ids.shape[1] - 1)[1]

    def decode(self, ids, start, state):
        with self.torch.no_grad():
            for t in range(ids.shape[1]):
                _, state = self.model.step(self.torch.from_numpy(ids[:, t]), state)


@dataclasses.dataclass(frozen=True)
class CudaOptions:
    """How `--device cuda` runs a model: the fast paths `edgettt.prepare` applies (`fast_paths.FastPaths`:
    all on by default, the fastest way measured) and `graph_prefill`, a ppN test's prefill captured as a CUDA
    graph before each timing (untimed, after an eager prefill) and timed as its replay, the host's launches
    out of the time as in decode. The switches are for the lab's studies (benchmarks/); `edgettt bench`
    runs the defaults."""

    compile: bool = True
    activations: str = "float"
    row_products: bool | None = None
    token_kernel: bool = True
    graph_prefill: bool = True
    fused_products: bool = True

    def fast_paths(self):
        """These options as `fast_paths.FastPaths` (imported here: a CPU worker timing an export runs without
        torch, its peak memory its own)."""
        from .fast_paths import FastPaths

        return FastPaths(activations=self.activations, compile=self.compile, row_products=self.row_products,
                         token_kernel=self.token_kernel, fused_products=self.fused_products)


class CudaEngine:
    """A model (or `llama:<preset>`, the same-size transformer of `edgettt.llama`) through torch on a
    CUDA GPU, weights and state in bfloat16, as many sequences as the ids have rows. Prefill is one call; decode replays
    CUDA graphs of `step`, one a token, as serving stacks run it (the launches of a step recorded
    once: a step of a small model is otherwise the host's time to launch its kernels). A TTT model's
    step depends on its place in the mini-batch, so it gets one graph per place (all on the same
    state tensors); the transformer's position is a device tensor, so it gets one graph."""

    def __init__(self, path: str, threads: int | None, options: CudaOptions | None = None):
        import torch

        self.torch = torch
        self.options = options or CudaOptions()
        if is_llama(path):
            from .llama import Llama

            with torch.device("cuda"):
                model = Llama(llama_config(path))
        else:
            from . import load

            model = load(path)
        from .fast_paths import prepare

        self.model = prepare(model, self.options.fast_paths())
        self.vocab = self.model.config.vocab_size
        self.graphs = None
        self.prefill_graph = None  # (its input tensor, `CapturedPrefill`): `ready_prefill`
        # a prefill's matmul FLOPs a token (the head multiplies the last token's only: left out)
        self.prefill_flops_per_token = 2 * linear_parameters(self.model, head=False)

    def prefill(self, ids, room: int = 0):
        torch = self.torch
        x = torch.from_numpy(ids).cuda()
        if self.prefill_graph is not None and self.prefill_graph[0].shape == x.shape and room == 0:
            given, captured = self.prefill_graph
            given.copy_(x)
            captured.replay()
            torch.cuda.synchronize()
            return captured.state
        with torch.no_grad():
            state = self.model.init_state(x.shape[0], x.shape[1] + room) if is_llama_model(self.model) else None
            _, state = self.model.prefill(x, state, logits_from=x.shape[1] - 1)
        torch.cuda.synchronize()
        return state

    def ready_prefill(self, ids) -> bool:
        """With `graph_prefill`: capture the prefill of ids' shape as a CUDA graph (not timed; after one
        eager prefill, in which kernels autotune), so that `prefill` replays it. Returns whether it did."""
        if not self.options.graph_prefill:
            return False
        x = self.torch.from_numpy(ids).cuda()
        self.prefill(ids)
        self.prefill_graph = (x, capture_prefill(self.model, x, logits_from=x.shape[1] - 1))
        return True

    def ready(self, ids, start, state):
        """Capture the decode graphs on `state` (not timed), and put the ids on the GPU."""
        from .kernels import kernels_off

        self.ids = self.torch.from_numpy(ids).cuda()
        # compiled, the step is all inductor's: edgettt's kernels off while it is traced (and captured)
        with self.torch.no_grad(), (kernels_off() if self.options.compile else contextlib.nullcontext()):
            self.graphs = capture_steps(self.model, state, start, ids.shape[0])
        self.torch.cuda.synchronize()
        self.step_bytes = decode_bytes(self.model, state)

    def decode(self, ids, start, state):
        token, graphs = self.graphs
        for t in range(ids.shape[1]):
            token.copy_(self.ids[:, t])
            graphs[(start + t) % len(graphs)].replay()
        self.torch.cuda.synchronize()

    def release(self):
        """Drop the captured graphs and their memory pools (a kept worker's next test starts without them)."""
        self.graphs = self.ids = self.prefill_graph = None
        self.torch.cuda.empty_cache()


class CapturedPrefill:
    """A prefill recorded as a CUDA graph, with the state it leaves (for the transformer the cache it was
    given, made outside the graph: held here as long as the graph, which would otherwise replay into
    freed memory)."""

    def __init__(self, graph, state):
        self.graph, self.state = graph, state

    def replay(self):
        self.graph.replay()


def capture_prefill(model, ids, logits_from: int | None = None) -> CapturedPrefill:
    """`model.prefill(ids)` from a fresh state (the transformer: a cache of ids' length) recorded as a CUDA
    graph; run it eagerly once first (kernels autotune outside the capture). A replay recomputes it from
    what is then in `ids`' tensor."""
    import torch

    with torch.no_grad():
        cache = model.init_state(ids.shape[0], ids.shape[1]) if is_llama_model(model) else None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _, state = model.prefill(ids, cache, logits_from=logits_from)
    torch.cuda.synchronize()
    return CapturedPrefill(graph, state)


def capture_steps(model, state, start: int, batch: int):
    """(the graphs' token input [batch], the CUDA graphs of one decode step on `state`'s tensors): one
    graph for the transformer, one for each place in the mini-batch for a TTT model (graph i steps a
    token at a position = i mod b). Kernels autotune (and a compiled step compiles) on a copy of the
    state first."""
    import functools

    import torch

    from .fast_paths import step_in_place

    token = torch.zeros(batch, dtype=torch.long, device="cuda")
    period = model.config.mini_batch_size if not is_llama_model(model) else None
    # the first position at each place in the mini-batch (the transformer: one graph, no position)
    positions = [None] if period is None else [start + (place - start) % period for place in range(period)]
    advance = getattr(model, "step_in_place", None) or functools.partial(step_in_place, model)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a copy
        scratch = _copy_state(state)
        for position in positions:
            advance(token, scratch, position)
    torch.cuda.current_stream().wait_stream(side)
    pool, graphs = torch.cuda.graph_pool_handle(), []
    for position in positions:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            advance(token, state, position)
        graphs.append(graph)
    return token, graphs


def decode_bytes(model, state) -> int:
    """Bytes a decode step must move at least: the weights and the state it reads."""
    return weight_bytes(model) + state_bytes(state)


def linear_parameters(model, head: bool = True) -> int:
    """Parameters of the linear layers, float or quantized (the embedding not; the LM head unless `head`
    is False): a token's matmul FLOPs are twice this."""
    from torch import nn

    from .quant import QuantLinear

    total = 0
    for name, module in model.named_modules():
        if not head and name == "lm_head":
            continue
        if isinstance(module, nn.Linear):
            total += module.weight.numel()
        elif isinstance(module, QuantLinear):
            total += module.in_features * module.out_features
    return total


def dense_bf16_flops(gpu: str) -> float | None:
    """The GPU's dense bfloat16 tensor-core rate from its datasheet (FLOP/s), for the GPUs it is known for."""
    return 989.4e12 if any(name in gpu for name in ("H100", "H200")) else None  # SXM; H100 PCIe is lower


def weight_bytes(model) -> int:
    """The weights as the GPU holds them (quantized layers: their codes and scales)."""
    from .quant import QuantLinear

    return sum(p.nbytes for p in model.parameters()) + sum(m.nbytes() for m in model.modules()
                                                           if isinstance(m, QuantLinear))


def state_bytes(state) -> int:
    """The state a step reads, as the step holds it: the KV cache (its capacity: the depth and the decoded
    tokens), or a TTT model's state tensors, every sequence's. (In torch the int8 state formats keep S on
    their grid in the model's float type, so this is more than the stored format's `decode_state_bytes`.)"""
    from .llama import KVCache

    if isinstance(state, KVCache):
        return sum(t.nbytes for t in state.keys + state.values)
    return sum(t.nbytes for layer in state.layers for t in layer.values())


def _copy_state(state):
    """A copy of a decode state (its tensors cloned; the transformer's rotary tables shared)."""
    from .llama import KVCache
    from .model import State

    if isinstance(state, KVCache):
        return KVCache([k.clone() for k in state.keys], [v.clone() for v in state.values], state.pos.clone(),
                       state.cos, state.sin)
    return State(state.pos, [{k: v.clone() for k, v in layer.items()} for layer in state.layers])


def is_llama_model(model) -> bool:
    from .llama import Llama

    return isinstance(model, Llama)


LLAMA_PREFIX = "llama:"


def is_llama(path: str) -> bool:
    return str(path).startswith(LLAMA_PREFIX)


def llama_preset(path: str) -> str:
    return str(path)[len(LLAMA_PREFIX):]


def llama_config(path: str):
    """`llama:<preset>`: a Llama of the TTT preset's hidden size, layers, heads, MLP and vocabulary."""
    from .config import PRESET_VOCAB, PRESETS
    from .llama import LlamaConfig

    return LlamaConfig(**PRESETS[llama_preset(path)], vocab_size=PRESET_VOCAB)


class GenaiEngine:
    """A model folder of onnxruntime-genai (its model builder's output: genai_config.json), through its
    Generator: the transformer with a KV cache that a user would run instead (the anchor of
    `benchmarks/anchor_llama.py`). Prefill appends the prompt's tokens; decode appends one token a
    step (the given ids, as the other engines: no sampling is timed)."""

    def __init__(self, path: str, threads: int | None):
        import onnxruntime_genai as og

        config = og.Config(str(path))
        if threads:
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        self.og, self.model = og, og.Model(config)
        self.vocab = json.loads((Path(path) / GENAI_CONFIG).read_text())["model"]["vocab_size"]

    def prefill(self, ids, room: int = 0):
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=ids.shape[1] + room)  # the KV cache's length
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(ids.astype("int32"))
        return generator

    def decode(self, ids, start, generator):
        for t in range(ids.shape[1]):
            generator.append_tokens(ids[:, t:t + 1].astype("int32"))


GENAI_CONFIG = "genai_config.json"


def is_export(path: str) -> bool:
    return (Path(path) / "manifest.json").is_file()


def is_genai(path: str) -> bool:
    return (Path(path) / GENAI_CONFIG).is_file()


def engine_name(path: str) -> str:
    return "onnxruntime" if is_export(path) else "onnxruntime-genai" if is_genai(path) else "torch"


ENGINES = {"onnxruntime": OnnxEngine, "onnxruntime-genai": GenaiEngine, "torch": TorchEngine}


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


def _worker(conn, path: str, threads: int | None, seed: int, device: str = "cpu", batch: int = 1,
            cuda: CudaOptions | None = None, siblings: int = 1) -> None:
    """A worker process: load `path`, answer ("ready", pid) (or ("error", line)), then serve the parent's
    requests until None: ("warm", test) runs the test once, untimed (the first runs of a session allocate,
    plan, autotune and compile), answered ("warm",); ("time", test) warms up first if this worker has not
    run the test yet, then times it, answered (seconds, peak MB, pid, bytes a decode step moves or None, a
    prefill token's matmul FLOPs or None):
    the peak is resident memory on the CPU (the process's high-water mark), the GPU memory allocated
    during the test on CUDA; ("copy", None) measures the GPU's copy bandwidth, answered (bytes/s,)."""
    import os

    import numpy as np

    if siblings > 1 and device == "cuda" and cuda is not None and cuda.compile:
        share_compile_threads(siblings)
    try:
        engine = CudaEngine(path, threads, cuda) if device == "cuda" else ENGINES[engine_name(path)](path, threads)
    except Exception as exc:  # reported to the parent as one line
        conn.send(("error", f"{path}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    rng, warmed = np.random.default_rng(seed), set()
    while (request := _next_request(conn)) is not None:
        kind, test = request
        if kind == "copy":  # the ceiling the decode rows are set against, measured while the GPU is idle
            from .gpu_timing import copy_bandwidth

            conn.send((copy_bandwidth(),))
            continue
        try:
            if test not in warmed:
                time_test(engine, warm_up_test(test, device), rng, batch)
                warmed.add(test)
            if kind == "warm":
                conn.send(("warm",))
                continue
            reset_peak(device)
            engine.step_bytes = None
            seconds = time_test(engine, test, rng, batch)
            conn.send((seconds, peak_mb(device), os.getpid(), engine.step_bytes,
                       getattr(engine, "prefill_flops_per_token", None)))
        except Exception as exc:
            conn.send(("error", f"{path}: {test.name} failed: {type(exc).__name__}: {exc}"))
            return


def share_compile_threads(workers: int) -> None:
    """Inductor's compile workers a kept worker may start: the cores shared among the `workers` that
    compile side by side (each would otherwise start one a core: 14 workers, 224 processes)."""
    import torch

    torch._inductor.config.compile_threads = max(1, multiprocessing.cpu_count() // workers)


def _next_request(conn):
    """The parent's next request; None when it says so or has gone (its end of the pipe closed)."""
    try:
        return conn.recv()
    except EOFError:
        return None


def warm_up_test(test: Test, device: str) -> Test:
    """The untimed run before a test: on CUDA the test itself (kernels autotune, and steps compile, for
    each new shape), on the CPU a short run of the same kind."""
    return test if device == "cuda" else Test(test.kind, min(test.tokens, 16), min(test.depth, 16))


def reset_peak(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()


def peak_mb(device: str) -> float:
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    from .runner import peak_memory_mb

    return peak_memory_mb()


# ---- the run ------------------------------------------------------------------------------------------

def disk_facts(path: str) -> dict:
    """Bytes on disk; for an export, decode.onnx's bytes and nodes (subgraphs included) too."""
    from .checkpoint import resolve_model_path

    p = resolve_model_path(path)
    facts = {"bytes": sum(f.stat().st_size for f in p.rglob("*") if f.is_file())}
    decode_graph = p / "decode.onnx" if is_export(path) else p / _genai_file(p) if is_genai(path) else None
    if decode_graph is not None:
        import onnx

        model = onnx.load(str(decode_graph), load_external_data=False)
        facts["decode_onnx_bytes"] = graph_bytes(decode_graph)  # with the weights it reads
        facts["decode_nodes"] = count_nodes(model.graph, {(f.domain, f.name): f for f in model.functions})
    return facts


def _genai_file(folder: Path) -> str:
    """The decoder graph of an onnxruntime-genai model folder (one graph serves prefill and decode)."""
    return json.loads((folder / GENAI_CONFIG).read_text())["model"]["decoder"]["filename"]


def count_nodes(graph, functions: dict | None = None) -> int:
    """Nodes an ONNX graph runs: those inside Scan / If / Loop bodies counted too, and a call of a
    model-local function as the nodes of its body."""
    total = 0
    for node in graph.node:
        body = (functions or {}).get((node.domain, node.op_type))
        total += count_nodes(body, functions) if body is not None else 1
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                total += count_nodes(sub, functions)
    return total


def check_paths(paths: list[str], device: str = "cpu", cuda: CudaOptions | None = None) -> None:
    """Every path an export, a model directory or a shipped name (on CUDA: a model or `llama:<preset>`),
    and the CUDA options that fit them, before any worker starts."""
    from .checkpoint import resolve_model_path
    from .config import PRESETS

    cuda = cuda or CudaOptions()
    if not paths:
        raise EdgetttError("bench: no PATH given; give export directories (`edgettt export`) or models")
    if cuda != CudaOptions() and device != "cuda":
        raise EdgetttError(f"bench: {cuda} chooses how --device cuda runs models; add --device cuda (an export's "
                           "int8 activations are chosen by `edgettt export --activations`)")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise EdgetttError("bench --device cuda: no CUDA GPU (torch.cuda.is_available() is False); run it on "
                               "a machine with one, or time on the CPU")
    for path in paths:
        if is_llama(path):
            if device != "cuda" or llama_preset(path) not in PRESETS:
                raise EdgetttError(f"{path}: the transformer baseline is llama:<preset> (presets "
                                   f"{', '.join(PRESETS)}) and runs with --device cuda")
            continue
        if device == "cuda" and (is_export(path) or is_genai(path)):
            raise EdgetttError(f"{path}: an ONNX model; --device cuda times models through torch: give model "
                               "directories or shipped names (or time exports on the CPU)")
        if not is_export(path) and not is_genai(path) and not (resolve_model_path(path) / "config.json").is_file():
            raise EdgetttError(f"{path}: neither an export (manifest.json), an onnxruntime-genai model "
                               f"({GENAI_CONFIG}) nor a model (config.json); give export directories from "
                               "`edgettt export` or models")
        if is_genai(path):
            try:
                import onnxruntime_genai  # noqa: F401
            except ImportError:
                raise EdgetttError(f"{path}: an onnxruntime-genai model, and onnxruntime-genai is not installed; "
                                   "pip install onnxruntime-genai") from None


def run(paths: list[str], test_list: list[Test], repetitions: int = 5, threads: int | None = None,
        seed: int = 0, device: str = "cpu", batch: int = 1, cuda: CudaOptions | None = None,
        keep_workers: bool | None = None, partial=None) -> dict:
    """Time every test of every path `repetitions` times, the paths taking turns, one measurement at a
    time. Workers (`_worker`): fresh, a new process for each measurement (the CPU's default: each peak
    resident memory is its own, and the machine holds one model at a time), or kept, one process a path
    for the whole run (CUDA's default, `keep_workers`): models load, and steps compile, once, all workers
    warming up on every test side by side before the timing starts. `partial`, if given, is called with
    the result of the repetitions done after each but the last (a run cut short keeps what it measured).
    Returns the JSON."""
    from .progress import bar

    cuda = cuda or CudaOptions()
    check_paths(paths, device, cuda)
    keep = device == "cuda" if keep_workers is None else keep_workers
    workers = Workers(paths, (threads, seed, device, batch, cuda, len(paths) if keep else 1), keep)
    times = {(p, t.name): [] for p in paths for t in test_list}
    peaks = {(p, t.name): 0.0 for p in paths for t in test_list}
    moved, flops, order, ceiling = {}, {}, [], None

    def result_after(done: int) -> dict:
        result = summarise(paths, test_list, times, peaks, order, done, threads, device, batch)
        result["meta"].update(repetitions_asked=repetitions, workers="one a path, kept" if keep else "one a measurement")
        if device == "cuda":
            result["meta"].update(compile=cuda.compile, activations=cuda.activations,
                                  row_products=cuda.compile and ("auto" if cuda.row_products is None else cuda.row_products),
                                  token_kernel=cuda.compile and cuda.token_kernel, graph_prefill=cuda.graph_prefill,
                                  fused_products=cuda.compile and cuda.fused_products,
                                  copy_bandwidth_GBps=ceiling / 1e9)
            peak_flops = dense_bf16_flops(result["meta"]["gpu"])
            result["meta"]["dense_bf16_TFLOPs"] = peak_flops and peak_flops / 1e12
            for row in result["rows"]:
                add_fraction_of_copy(row, moved[(row["path"], row["test"])], ceiling, batch)
                if row["test"].startswith("pp") and peak_flops:
                    row["fraction_of_dense_bf16"] = flops[row["path"]] * row["tokens_per_s"] / peak_flops
        return result

    try:
        if keep:
            workers.warm_up(test_list)
        if device == "cuda":
            ceiling = workers.copy_bandwidth(paths[0])
        with bar(total=repetitions * len(paths) * len(test_list), desc="bench", unit="test") as progress:
            for r in range(1, repetitions + 1):
                for test in test_list:
                    for path in paths:
                        seconds, peak, pid, step_bytes, flops[path] = workers.time(path, test)
                        times[(path, test.name)].append(seconds)
                        peaks[(path, test.name)] = max(peaks[(path, test.name)], peak)
                        moved[(path, test.name)] = step_bytes
                        order.append([r, path, test.name, pid])
                        progress.update()
                if partial is not None and r < repetitions:
                    partial(result_after(r))
    finally:
        workers.close()
    return result_after(repetitions)


def add_fraction_of_copy(row: dict, step_bytes: int | None, ceiling: float, batch: int) -> None:
    """A decode row's bytes a step must move (`decode_bytes`) and the fraction of the copy bandwidth
    they take at its median speed (a step decodes `batch` tokens)."""
    if step_bytes is not None:
        row.update(step_bytes=step_bytes, fraction_of_copy=step_bytes * row["tokens_per_s"] / batch / ceiling)


class Workers:
    """The worker processes of a run (spawned: nothing shared with the parent): `keep`, one a path,
    started together; else one a measurement, ended after it."""

    def __init__(self, paths: list[str], options: tuple, keep: bool):
        self.ctx = multiprocessing.get_context("spawn")
        self.options, self.keep, self.kept = options, keep, {}
        if keep:
            self.kept = {path: self._start(path) for path in paths}
            try:
                for path, worker in self.kept.items():
                    _receive(worker[0], path)
            except EdgetttError:
                self.close()
                raise

    def _start(self, path: str):
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, path, *self.options), daemon=True)
        proc.start()
        return parent, proc

    def warm_up(self, test_list: list[Test]) -> None:
        """Every kept worker runs every test once, untimed, all workers at the same time."""
        for test in test_list:
            for conn, _ in self.kept.values():
                conn.send(("warm", test))
        for test in test_list:
            for path, (conn, _) in self.kept.items():
                _receive(conn, path)

    def time(self, path: str, test: Test) -> tuple[float, float, int, int | None, int | None]:
        """(seconds, peak MB, the worker's pid, bytes a decode step moves or None, a prefill token's matmul
        FLOPs or None) of one measurement."""
        return self._ask(path, ("time", test))

    def copy_bandwidth(self, path: str) -> float:
        """The GPU's copy bandwidth (`bench.copy_bandwidth`), measured by `path`'s worker."""
        return self._ask(path, ("copy", None))[0]

    def _ask(self, path: str, request):
        """`path`'s kept worker's answer to `request`, or a fresh worker's (started, then stopped)."""
        if self.keep:
            return _receive(self.kept[path][0], path, request)
        worker = self._start(path)
        try:
            _receive(worker[0], path)
            return _receive(worker[0], path, request)
        finally:
            _stop(*worker)

    def close(self) -> None:
        for worker in self.kept.values():
            _stop(*worker)
        self.kept = {}


def _stop(conn, proc) -> None:
    with contextlib.suppress(OSError):
        conn.send(None)
    proc.join(timeout=30)
    if proc.is_alive():
        proc.kill()


def _receive(conn, path: str, request=None):
    """Send `request` (if any) and return the worker's answer; a worker's error is raised as one line."""
    try:
        if request is not None:
            conn.send(request)
        answer = conn.recv()
    except (EOFError, OSError):
        raise EdgetttError(f"{path}: its worker process ended without an answer (out of memory?); time it "
                           "alone, or with fewer tokens") from None
    if answer[0] == "error":
        raise EdgetttError(answer[1])
    return answer


def summarise(paths, test_list, times, peaks, order, repetitions, threads, device="cpu", batch=1) -> dict:
    import onnxruntime

    rows = []
    for path in paths:
        facts = llama_facts(path) if is_llama(path) else disk_facts(path)
        for test in test_list:
            rates = [batch * test.tokens / s for s in times[(path, test.name)]]
            ref = [batch * test.tokens / s for s in times[(paths[0], test.name)]]
            rows.append({"path": path, "engine": "torch cuda" if device == "cuda" else engine_name(path),
                         "test": test.name, "tokens_per_s": statistics.median(rates), "min": min(rates),
                         "max": max(rates), "vs_first": statistics.median(a / b for a, b in zip(rates, ref)),
                         "peak_rss_mb": peaks[(path, test.name)], **facts})
    import torch

    meta = {"cpu": cpu_name(), "cores": multiprocessing.cpu_count(),
            "threads": threads, "repetitions": repetitions, "onnxruntime": onnxruntime.__version__,
            "torch": torch.__version__, "python": platform.python_version(), "batch": batch, "device": device}
    if device == "cuda":
        import triton

        meta.update(gpu=torch.cuda.get_device_name(), triton=triton.__version__, dtype="bfloat16",
                    decode="a CUDA graph replay a token", peak="GPU memory allocated (torch.cuda.max_memory_allocated)")
    return {"meta": meta, "rows": rows, "order": order}


def llama_facts(path: str) -> dict:
    """The transformer baseline's bytes: its parameters in bfloat16 (it has no files)."""
    import torch

    from .llama import Llama

    with torch.device("meta"):
        params = sum(p.numel() for p in Llama(llama_config(path)).parameters())
    return {"bytes": 2 * params}


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table(result: dict) -> str:
    """The rows as a Markdown table (also what the terminal shows); on CUDA each row against its hardware
    limit: a decode row's fraction of the copy bandwidth on the bytes a step must move, a prefill row's of
    the GPU's dense bf16 rate on its matmul FLOPs."""
    cuda = result["meta"].get("device") == "cuda"
    lines = ["| path | engine | MB | test | tokens/s | min | max | x first | peak MB |" + (" of limit |" if cuda else ""),
             "|---|---|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if cuda else "")]
    for r in result["rows"]:
        limit = ""
        if cuda:
            limit = (f" {r['fraction_of_copy']:.1%} copy |" if "fraction_of_copy" in r else
                     f" {r['fraction_of_dense_bf16']:.1%} bf16 |" if "fraction_of_dense_bf16" in r else " |")
        lines.append(f"| {r['path']} | {r['engine']} | {r['bytes'] / 1e6:.1f} | {r['test']} | "
                     f"{r['tokens_per_s']:.1f} | {r['min']:.1f} | {r['max']:.1f} | {r['vs_first']:.2f} | "
                     f"{r['peak_rss_mb']:.0f} |{limit}")
    return "\n".join(lines)


def write(result: dict, json_out=None, markdown_out=None) -> None:
    if json_out is not None:
        with json_out.write() as tmp:
            tmp.write_text(json.dumps(result, indent=2) + "\n")
    if markdown_out is not None:
        with markdown_out.write() as tmp:
            tmp.write_text(f"{table(result)}\n\n{footer(result['meta'])}\n")


def footer(meta: dict) -> str:
    """Where and how the table was measured, in one line."""
    if meta.get("device") == "cuda":
        how = ("decode steps compiled (torch.compile), " if meta.get("compile") else "") + \
            {True: "batch-1 float products as inductor's reductions, ", "auto": "batch-1 float products as inductor's "
             "reductions where the hidden size is <= 1024, "}.get(meta.get("row_products"), "") + \
            ("a TTT layer's token in one kernel, " if meta.get("token_kernel") else "") + \
            ("int4 products with their norm, activation and residual in one kernel, " if meta.get("fused_products") else "") + \
            ("int8 activations in the quantized prefill GEMMs, " if meta.get("activations") == "int8" else "") + \
            ("prefill: a CUDA graph replay, " if meta.get("graph_prefill") else "")
        return (f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['dtype']}, {how}decode: "
                f"{meta['decode']}; peak MB: {meta['peak']}; {meta['repetitions']} repetitions, batch {meta['batch']}.")
    return (f"CPU {meta['cpu']} ({meta['cores']} cores), threads {meta['threads'] or 'default'}, onnxruntime "
            f"{meta['onnxruntime']}, torch {meta['torch']}, {meta['repetitions']} repetitions, batch {meta['batch']}.")
