"""`edgettt bench`, the parent's side: checks the paths, starts the workers (`worker.serve`), takes the
repetitions in turns, and makes the rows, the table and the JSON."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import platform
import statistics
import sys
from importlib import metadata, util
from pathlib import Path

import onnx
import onnxruntime
import torch

from edgettt.checkpoint import foreign_checkpoint, resolve_model_path
from edgettt.outputs import STDOUT, write_json
from edgettt.families.ttt.config import PRESETS
from edgettt.errors import EdgetttError
from edgettt.onnx_files import graph_bytes
from edgettt.progress import bar
from edgettt.benchmark.llama import Llama, LlamaConfig
from edgettt.benchmark.plan import (GENAI_CONFIG, CudaOptions, Test, cpu_name, dense_bf16_flops, engine_name, folder, is_export,
                   is_genai, is_llama, llama_preset)
from edgettt.benchmark.worker import serve


def disk_facts(path: str) -> dict:
    """Bytes on disk; for an export, decode.onnx's bytes and nodes (subgraphs included) too."""
    p = resolve_model_path(folder(path))
    facts = {"bytes": sum(f.stat().st_size for f in p.rglob("*") if f.is_file())}
    decode_graph = p / _genai_file(p) if is_genai(path) else p / "decode.onnx" if is_export(path) else None
    if decode_graph is not None:
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
    cuda = cuda or CudaOptions()
    if not paths:
        raise EdgetttError("bench: no PATH given; give export directories (`edgettt export`) or models")
    if cuda != CudaOptions() and device != "cuda":
        raise EdgetttError(f"bench: {cuda} chooses how --device cuda runs models; add --device cuda (an export's "
                           "int8 activations are chosen by `edgettt export --activations`)")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise EdgetttError("bench --device cuda: no CUDA GPU (torch.cuda.is_available() is False); run it on "
                               "a machine with one, or time on the CPU")
    for path in paths:
        if is_llama(path):
            if device != "cuda" or llama_preset(path) not in PRESETS:
                raise EdgetttError(f"{path}: the transformer baseline is llama:<preset> (presets "
                                   f"{', '.join(PRESETS)}) and runs with --device cuda")
            continue
        if is_genai(path) and not (Path(folder(path)) / GENAI_CONFIG).is_file():
            raise EdgetttError(f"{path}: no {GENAI_CONFIG} in {folder(path)}; genai:EXPORT needs an export with a "
                               "float state (its onnxruntime-genai files)")
        if device == "cuda" and (is_export(path) or is_genai(path)):
            raise EdgetttError(f"{path}: an ONNX model; --device cuda times models through torch: give model "
                               "directories or shipped names (or time exports on the CPU)")
        if not is_export(path) and not is_genai(path) and not is_model(path):
            raise EdgetttError(f"{path}: neither an export (manifest.json), an onnxruntime-genai model "
                               f"({GENAI_CONFIG}) nor a model (config.json or a ttt-lm-jax checkpoint); give "
                               "export directories from `edgettt export` or models")
        if is_genai(path) and not installed("onnxruntime_genai"):
            raise EdgetttError(f"{path}: an onnxruntime-genai model, and onnxruntime-genai is not installed; "
                               "pip install onnxruntime-genai")


def is_model(path: str) -> bool:
    """A model directory, a shipped model's name or a ttt-lm-jax checkpoint (its file or folder)."""
    resolved = resolve_model_path(path)
    return (resolved / "config.json").is_file() or foreign_checkpoint(resolved) is not None


def installed(package: str) -> bool:
    """Whether `package` can be imported (without importing it)."""
    if package in sys.modules:
        return sys.modules[package] is not None
    return util.find_spec(package) is not None


def run(paths: list[str], test_list: list[Test], repetitions: int = 5, threads: int | None = None,
        seed: int = 0, device: str = "cpu", batch: int = 1, cuda: CudaOptions | None = None,
        keep_workers: bool | None = None, partial=None) -> dict:
    """Time every test of every path `repetitions` times, the paths taking turns, one measurement at a
    time. Workers (`worker.serve`): fresh, a new process for each measurement (the CPU's default: each peak
    resident memory is its own, and the machine holds one model at a time), or kept, one process a path
    for the whole run (CUDA's default, `keep_workers`): models load, and steps compile, once, all workers
    warming up on every test side by side before the timing starts. `partial`, if given, is called with
    the result of the repetitions done after each but the last (a run cut short keeps what it measured).
    Returns the JSON."""
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
        proc = self.ctx.Process(target=serve, args=(child, path, *self.options), daemon=True)
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
    meta = {"cpu": cpu_name(), "cores": multiprocessing.cpu_count(),
            "threads": threads, "repetitions": repetitions, "onnxruntime": onnxruntime.__version__,
            "torch": torch.__version__, "python": platform.python_version(), "batch": batch, "device": device}
    if device == "cuda":
        meta.update(gpu=torch.cuda.get_device_name(), triton=metadata.version("triton"), dtype="bfloat16",
                    decode="a CUDA graph replay a token", peak="GPU memory allocated (torch.cuda.max_memory_allocated)")
    return {"meta": meta, "rows": rows, "order": order}


def llama_facts(path: str) -> dict:
    """The transformer baseline's bytes: its parameters in bfloat16 (it has no files)."""
    with torch.device("meta"):
        params = sum(p.numel() for p in Llama(LlamaConfig.of_preset(llama_preset(path))).parameters())
    return {"bytes": 2 * params}


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


def write(result: dict, json_out=None, markdown_out=None, final: bool = True) -> None:
    """The result to its files (rewritten after every repetition: `final` False), JSON to standard output once,
    at the end."""
    if json_out is not None and (final or json_out != STDOUT):
        write_json(json_out, result)
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
