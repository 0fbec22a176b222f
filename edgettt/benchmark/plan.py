"""What a benchmark run times: its tests, the kind of each path, and how CUDA runs models (plain Python:
the parent and every worker read it)."""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

from edgettt.runner import is_export

LLAMA_PREFIX = "llama:"
GENAI_PREFIX = "genai:"  # genai:EXPORT: an edgettt export timed through onnxruntime-genai, not edgettt's runner
GENAI_CONFIG = "genai_config.json"


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


def warm_up_test(test: Test, device: str) -> Test:
    """The untimed run before a test: on CUDA the test itself (kernels autotune, and steps compile, for
    each new shape), on the CPU a short run of the same kind."""
    return test if device == "cuda" else Test(test.kind, min(test.tokens, 16), min(test.depth, 16))


@dataclasses.dataclass(frozen=True)
class CudaOptions:
    """How `--device cuda` runs a model: the fast paths `edgettt.prepare` applies (`fast_paths.FastPaths`:
    all on by default, the fastest way measured) and `graph_prefill`, a ppN test's prefill captured as a CUDA
    graph before each timing (untimed, after an eager prefill) and timed as its replay, the host's launches
    out of the time as in decode. The switches are for the lab's studies (benchmarks/); `edgettt bench`
    runs the defaults. (Plain data, not `FastPaths` itself: a CPU worker receives it and runs without torch.)"""

    kernels: bool = True
    compile: bool = True
    activations: str = "float"
    row_products: bool | None = None
    token_kernel: bool = True
    graph_prefill: bool = True
    fused_products: bool = True


def is_genai(path: str) -> bool:
    """A folder onnxruntime-genai runs: its own model folder, or an export named as genai:EXPORT (an export
    alone runs in edgettt's runner)."""
    if str(path).startswith(GENAI_PREFIX):
        return True
    return (Path(path) / GENAI_CONFIG).is_file() and not is_export(path)


def folder(path: str) -> str:
    """The folder a path names (genai:EXPORT names EXPORT)."""
    return str(path).removeprefix(GENAI_PREFIX)


def is_llama(path: str) -> bool:
    return str(path).startswith(LLAMA_PREFIX)


def llama_preset(path: str) -> str:
    return str(path)[len(LLAMA_PREFIX):]


def engine_name(path: str) -> str:
    return "onnxruntime-genai" if is_genai(path) else "onnxruntime" if is_export(path) else "torch"


# engine name -> (module of this package, class): a worker imports only its engine's module
ENGINES = {"onnxruntime": ("onnx_engine", "OnnxEngine"), "onnxruntime-genai": ("genai_engine", "GenaiEngine"),
           "torch": ("torch_engine", "TorchEngine"), "torch cuda": ("cuda", "CudaEngine")}


def dense_bf16_flops(gpu: str) -> float | None:
    """The GPU's dense bfloat16 tensor-core rate from its datasheet (FLOP/s), for the GPUs it is known for."""
    return 989.4e12 if any(name in gpu for name in ("H100", "H200")) else None  # SXM; H100 PCIe is lower


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
