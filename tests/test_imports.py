"""The package's imports point one way: no cycles, the model never imports the checkpoint writer,
the operations (their references and kernels, `edgettt.ops`) import only each other and the quantization
leaves (storage layouts, the state formula), not the quantizer; the model files are plain math (no
kernel, no fast path, no environment variable, no tracing check; loading a model loads no kernel); every module stands in a declared layer (`LAYERS`) and imports
only from its own layer or those below; and few imports wait inside functions (outside the CLI,
whose lazy imports keep `edgettt run` free of torch).

Function-level imports count as much as module-level ones, and importing `a.b.c` imports the
package `a.b` too (its __init__ runs first): a drawing of the imports has every arrow.
"""

import ast
import subprocess
import sys
from pathlib import Path

import edgettt

ROOT = Path(edgettt.__file__).parent
# what an operation may import besides the other operations: the number formats (storage layouts, state formulas)
OPS_MAY_IMPORT = {"edgettt.formats", "edgettt.formats.layouts", "edgettt.formats.state_formats", "edgettt.errors"}
# the model files, and what they may not import: kernels and the fast paths `edgettt.prepare` applies
MODEL_FILES = ("edgettt.families.base", "edgettt.families.ttt.model", "edgettt.families.ttt.mixer",
               "edgettt.families.ttt.original", "edgettt.families.ttt.converted", "edgettt.families.lact.model",
               "edgettt.families.lact.window")
KERNEL_MODULES = ("edgettt.ops.common", "edgettt.ops.linear_attention.prefill", "edgettt.ops.linear_attention.decode",
                  "edgettt.ops.linear_attention.decode_token", "edgettt.ops.linear_attention.commits",
                  "edgettt.ops.linear_attention.train", "edgettt.ops.lact.triton", "edgettt.ops.quantized",
                  "edgettt.fast_paths", "edgettt.families.ttt.kernels", "edgettt.families.lact.kernels")
SPEED_HOOKS = {"environ", "getenv", "is_compiling", "is_exporting", "exporting", "kernels_enabled"}
LEAVES = ("edgettt.formats",)  # a package that imports nothing of edgettt
LAZY_PACKAGES = ("edgettt", "edgettt.benchmark")  # their names load on first use: no static import in __init__


# the layers, lowest first, each a list of folders and files; a module belongs to the longest prefix that names it
LAYERS = [
    ("base", ["edgettt.errors", "edgettt.progress", "edgettt.outputs", "edgettt.tokenizer", "edgettt.gpu_timing",
              "edgettt.cuda_graph", "edgettt.ort_schemas", "edgettt.metrics", "edgettt.data", "edgettt.weights_io",
              "edgettt.onnx_files", "edgettt.state_file", "edgettt.threads", "edgettt.formats",
              "edgettt.distributed"]),
    ("math: the operations, their references and kernels", ["edgettt.ops"]),
    ("quantized layers", ["edgettt.quant"]),
    ("model families", ["edgettt.families"]),
    ("pipeline: what runs models on text and files", ["edgettt.conversion", "edgettt.checkpoint", "edgettt.evaluation",
                                                     "edgettt.distill", "edgettt.resume", "edgettt.calibration",
                                                     "edgettt.onnx",
                                                     "edgettt.runner", "edgettt.reporting", "edgettt.fast_paths",
                                                     "edgettt.web", "edgettt.model_info"]),
    ("tools", ["edgettt.benchmark", "edgettt.comparison", "edgettt.api"]),
    ("command line", ["edgettt.cli", "edgettt.__main__", "edgettt"]),
]
MAX_FUNCTION_LEVEL_IMPORTS = 40  # outside the CLI


def modules() -> dict[str, Path]:
    out = {}
    for file in ROOT.rglob("*.py"):
        parts = list(file.relative_to(ROOT.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the edgettt modules it imports (anywhere in its body)."""
    mods = modules()
    graph = {m: set() for m in mods}
    for mod, file in mods.items():
        package = mod.split(".") if file.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                name = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                targets = [name, *(f"{name}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t in mods}
    for mod in graph:  # the packages an import passes through run their __init__ first
        graph[mod] |= {".".join(t.split(".")[:i]) for t in graph[mod] for i in range(1, t.count(".") + 1)}
        graph[mod] -= {mod, *(".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1))}
    return graph


def test_no_import_cycles():
    graph, state = import_graph(), {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph[module]):
            assert state.get(target) != "open", "import cycle: " + " -> ".join(path + [module, target])
            if target not in state:
                visit(target, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_the_model_does_not_import_the_checkpoint_writer_and_kernels_import_only_leaves():
    graph = import_graph()
    assert "edgettt.checkpoint" not in graph["edgettt.families.ttt.model"]
    for module, targets in graph.items():
        if module.startswith("edgettt.ops"):
            outside = {t for t in targets if not t.startswith("edgettt.ops")} - set(LAZY_PACKAGES)
            assert outside <= OPS_MAY_IMPORT, f"{module} imports {sorted(outside - OPS_MAY_IMPORT)}"
    assert "edgettt.quant.weight_formats" not in graph["edgettt.ops.quantized.int4"]
    for leaf in LEAVES:
        inside = {m for m in graph if m == leaf or m.startswith(leaf + ".")}
        for module in inside:
            outside = graph[module] - inside - {"edgettt"}
            assert not outside, f"{module} imports {sorted(outside)}"
    for package in LAZY_PACKAGES:
        assert graph[package] <= {"edgettt.errors"}, f"{package}/__init__.py imports {sorted(graph[package])}"


def test_the_model_files_are_plain_math():
    """No model file imports a kernel or a fast path, reads an environment variable or asks whether it is
    being traced (compiled or exported); what makes a model fast is `edgettt.prepare`'s to apply."""
    graph, mods = import_graph(), modules()
    for module in MODEL_FILES:
        kernels = {t for t in graph[module] if t.startswith(KERNEL_MODULES)}
        assert not kernels, f"{module} imports {sorted(kernels)}"
        tree = ast.parse(mods[module].read_text())
        names = {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(tree)
                 if isinstance(n, (ast.Attribute, ast.Name))}
        assert not names & SPEED_HOOKS, f"{module} uses {sorted(names & SPEED_HOOKS)}"


def test_loading_a_model_loads_no_kernel():
    """(torch itself may load Triton: torch._dynamo looks for it.)"""
    kernels = tuple(m for m in KERNEL_MODULES if m != "edgettt.ops.common")  # (common: launch arithmetic, no Triton)
    code = ("import sys, edgettt; edgettt.load('ttt-linear-tiny-parallel'); edgettt.load('lact-w1-tiny'); "
            f"print(sorted(m for m in sys.modules if m.startswith({kernels!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest prefix naming `module`."""
    named = [(len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
             if module == p or module.startswith(p + ".")]
    assert named, f"{module} stands in no layer: add it to LAYERS"
    return max(named)[1]


def upward_imports() -> list[tuple[str, str]]:
    """Imports from a module to one in a higher layer (a lazy package's own name aside: it loads nothing)."""
    graph = import_graph()
    return sorted((m, t) for m, targets in graph.items() for t in targets
                  if t not in LAZY_PACKAGES and layer_of(t) > layer_of(m))


def function_level_imports() -> list[str]:
    """`file:line` of every import statement inside a function, outside the CLI."""
    found = set()
    for mod, file in modules().items():
        if mod in ("edgettt.cli", "edgettt.__main__"):
            continue
        for fn in ast.walk(ast.parse(file.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found |= {f"{file.relative_to(ROOT.parent)}:{n.lineno}" for n in ast.walk(fn)
                          if isinstance(n, (ast.Import, ast.ImportFrom))}
    return sorted(found)


def test_imports_run_down_the_layers():
    up = upward_imports()
    assert not up, "imports into a higher layer: " + ", ".join(f"{m} -> {t}" for m, t in up)


def test_few_imports_wait_inside_functions():
    found = function_level_imports()
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, found


def drawing() -> str:
    """docs/imports.md: the import graph as a Mermaid flowchart (GitHub draws it), one box a layer
    (`LAYERS`, lowest at the bottom), arrows from importer to imported. Left out, to keep it legible:
    `errors` (a leaf nearly every module imports) and the edges to a package's own __init__ that importing
    one of its modules implies."""
    graph = import_graph()
    short = lambda m: m.removeprefix("edgettt.").replace(".", "_") if m != "edgettt" else "edgettt"  # noqa: E731
    lines = ["# edgettt's imports", "",
             "Generated by `python tests/test_imports.py > docs/imports.md`; `tests/test_imports.py` checks",
             "that this file matches the code, that the graph has no cycle and that imports run down the layers",
             "(one box each, the lowest at the bottom). Arrows go from importer to imported; function-level",
             "imports count. Left out: `errors` (nearly every module imports it) and the edges to a package that",
             "importing one of its modules implies.", "", "```mermaid", "flowchart TB"]
    for i, (name, _) in reversed(list(enumerate(LAYERS))):
        lines.append(f'    subgraph layer{i}["{name}"]')
        lines += [f"        {short(m)}[{m.removeprefix('edgettt.')}]" for m in sorted(graph) if layer_of(m) == i]
        lines.append("    end")
    for module in sorted(graph):
        implied = {".".join(t.split(".")[:i]) for t in graph[module] for i in range(1, t.count(".") + 1)}
        for target in sorted(graph[module] - implied - {"edgettt.errors"}):
            lines.append(f"    {short(module)} --> {short(target)}")
    return "\n".join(lines + ["```", ""])


def test_the_drawing_of_the_imports_is_current():
    committed = (ROOT.parent / "docs" / "imports.md").read_text()
    assert committed == drawing(), "the imports changed: `python tests/test_imports.py > docs/imports.md`"


if __name__ == "__main__":
    print(drawing(), end="")
