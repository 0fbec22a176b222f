"""The package's imports point one way: no cycles, the model never imports the checkpoint writer,
and the kernels import only plain-torch math and the quantization leaves (storage layouts, the
state formula), not the quantizer.

Function-level imports count as much as module-level ones, and importing `a.b.c` imports the
package `a.b` too (its __init__ runs first): a drawing of the imports has every arrow.
"""

import ast
from pathlib import Path

import edgettt

ROOT = Path(edgettt.__file__).parent
# what a kernel may import besides other kernels: the references' plain-torch math and the storage layouts
PLAIN_TORCH_MATH = {"edgettt.quant.layouts", "edgettt.quant.state_formats", "edgettt.ops", "edgettt.linear_attention",
                    "edgettt.errors"}
LEAVES = ("edgettt.quant.layouts", "edgettt.quant.state_formats")  # import nothing of edgettt
LAZY_PACKAGES = ("edgettt", "edgettt.quant")  # their names load on first use: no static import in __init__


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
    assert "edgettt.checkpoint" not in graph["edgettt.model"]
    for module, targets in graph.items():
        if module.startswith("edgettt.kernels"):
            outside = {t for t in targets if not t.startswith("edgettt.kernels")} - set(LAZY_PACKAGES)
            assert outside <= PLAIN_TORCH_MATH, f"{module} imports {sorted(outside - PLAIN_TORCH_MATH)}"
    assert "edgettt.quant.weight_formats" not in graph["edgettt.kernels.int4"]
    for leaf in LEAVES:
        assert graph[leaf] <= set(LAZY_PACKAGES), f"{leaf} imports {sorted(graph[leaf])}"
    for package in LAZY_PACKAGES:
        assert graph[package] <= {"edgettt.errors"}, f"{package}/__init__.py imports {sorted(graph[package])}"
