"""`bench --device cuda`: a model (or `llama:<preset>`, the same-size transformer of `benchmark.llama`)
through torch on a CUDA GPU as `edgettt.prepare` makes it, decode steps replayed as CUDA graphs, a
prefill captured as one; and what a row is set against: the bytes a step moves, a prefill's matmul
FLOPs and the copy bandwidth."""

from __future__ import annotations

import functools
import multiprocessing

import torch
from torch import nn

from edgettt.checkpoint import load_model
from edgettt.fast_paths import FastPaths, prepare, step_in_place
from edgettt.gpu_timing import copy_bandwidth
from edgettt.benchmark.llama import KVCache, Llama, LlamaConfig
from edgettt.families.base import State
from edgettt.quant.linear import QuantLinear
from edgettt.benchmark.plan import CudaOptions, is_llama, llama_preset


def fast_paths(options: CudaOptions) -> FastPaths:
    """The fast paths a run's `CudaOptions` ask for."""
    return FastPaths(kernels=options.kernels, activations=options.activations, compile=options.compile, row_products=options.row_products,
                     token_kernel=options.token_kernel, fused_products=options.fused_products)


class CudaEngine:
    """Weights and state in bfloat16, as many sequences as the ids have rows. Prefill is one call (or a
    captured graph's replay); decode replays CUDA graphs of `step`, one a token, as serving stacks run it
    (the launches of a step recorded once: a step of a small model is otherwise the host's time to launch
    its kernels). A TTT model's step depends on its place in the mini-batch, so it gets one graph per
    place (all on the same state tensors); the transformer's position is a device tensor, so it gets one
    graph."""

    def __init__(self, path: str, threads: int | None, options: CudaOptions | None = None):
        self.options = options or CudaOptions()
        if is_llama(path):
            with torch.device("cuda"):
                model = Llama(llama_config(path))
        else:
            model = load_model(path)
        self.model = prepare(model, fast_paths(self.options))
        self.vocab = self.model.config.vocab_size
        self.graphs = None
        self.prefill_graph = None  # (its input tensor, `CapturedPrefill`): `ready_prefill`
        # a prefill's matmul FLOPs a token (the head multiplies the last token's only: left out)
        self.prefill_flops_per_token = 2 * linear_parameters(self.model, head=False)

    def prefill(self, ids, room: int = 0):
        x = torch.from_numpy(ids).cuda()
        if self.prefill_graph is not None and self.prefill_graph[0].shape == x.shape and room == 0:
            given, captured = self.prefill_graph
            given.copy_(x)
            captured.replay()
            torch.cuda.synchronize()
            return captured.state
        with torch.no_grad():
            state = self.model.init_state(x.shape[0], x.shape[1] + room) if isinstance(self.model, Llama) else None
            _, state = self.model.prefill(x, state, logits_from=x.shape[1] - 1)
        torch.cuda.synchronize()
        return state

    def ready_prefill(self, ids) -> bool:
        """With `graph_prefill`: capture the prefill of ids' shape as a CUDA graph (not timed; after one
        eager prefill, in which kernels autotune), so that `prefill` replays it. Returns whether it did."""
        if not self.options.graph_prefill:
            return False
        x = torch.from_numpy(ids).cuda()
        self.prefill(ids)
        self.prefill_graph = (x, capture_prefill(self.model, x, logits_from=x.shape[1] - 1))
        return True

    def ready(self, ids, start, state):
        """Capture the decode graphs on `state` (not timed), and put the ids on the GPU."""
        self.ids = torch.from_numpy(ids).cuda()
        with torch.no_grad():
            self.graphs = capture_steps(self.model, state, start, ids.shape[0])
        torch.cuda.synchronize()
        self.step_bytes = decode_bytes(self.model, state)

    def decode(self, ids, start, state):
        token, graphs = self.graphs
        for t in range(ids.shape[1]):
            token.copy_(self.ids[:, t])
            graphs[(start + t) % len(graphs)].replay()
        torch.cuda.synchronize()

    def release(self):
        """Drop the captured graphs and their memory pools (a kept worker's next test starts without them)."""
        self.graphs = self.ids = self.prefill_graph = None
        torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def peak_mb(self) -> float:
        """The GPU memory allocated at most since `reset_peak`."""
        return torch.cuda.max_memory_allocated() / 2**20

    copy_bandwidth = staticmethod(copy_bandwidth)


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
    with torch.no_grad():
        cache = model.init_state(ids.shape[0], ids.shape[1]) if isinstance(model, Llama) else None
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
    token = torch.zeros(batch, dtype=torch.long, device="cuda")
    period = model.config.mini_batch_size if not isinstance(model, Llama) else None
    # the first position at each place in the mini-batch (the transformer: one graph, no position)
    positions = [None] if period is None else [start + (place - start) % period for place in range(period)]
    advance = getattr(model, "step_in_place", None) or functools.partial(step_in_place, model)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a copy
        scratch = copy_state(state)
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
    total = 0
    for name, module in model.named_modules():
        if not head and name == "lm_head":
            continue
        if isinstance(module, nn.Linear):
            total += module.weight.numel()
        elif isinstance(module, QuantLinear):
            total += module.in_features * module.out_features
    return total


def weight_bytes(model) -> int:
    """The weights as the GPU holds them (quantized layers: their codes and scales)."""
    return sum(p.nbytes for p in model.parameters()) + sum(m.nbytes() for m in model.modules()
                                                           if isinstance(m, QuantLinear))


def state_bytes(state) -> int:
    """The state a step reads, as the step holds it: the KV cache (its capacity: the depth and the decoded
    tokens), or a TTT model's state tensors, every sequence's. (In torch the quantized state formats keep S
    on their grid in the model's float type, so this is more than the stored format's `decode_state_bytes`.)"""
    if isinstance(state, KVCache):
        return sum(t.nbytes for t in state.keys + state.values)
    return sum(t.nbytes for layer in state.layers for t in layer.values())


def copy_state(state):
    """A copy of a decode state (its tensors cloned; the transformer's rotary tables shared)."""
    if isinstance(state, KVCache):
        return KVCache([k.clone() for k in state.keys], [v.clone() for v in state.values], state.pos.clone(),
                       state.cos, state.sin)
    return State(state.pos, [{k: v.clone() for k, v in layer.items()} for layer in state.layers])


def llama_config(path: str) -> LlamaConfig:
    """`llama:<preset>`: a Llama of the TTT preset's hidden size, layers, heads, MLP and vocabulary."""
    return LlamaConfig.of_preset(llama_preset(path))


def share_compile_threads(workers: int) -> None:
    """Inductor's compile workers a kept worker may start: the cores shared among the `workers` that
    compile side by side (each would otherwise start one a core: 14 workers, 224 processes)."""
    torch._inductor.config.compile_threads = max(1, multiprocessing.cpu_count() // workers)
