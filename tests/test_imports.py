"""The package's imports point one way: no cycles, the model never imports the checkpoint writer,
and the kernels import only plain-torch math and the storage layouts, not the quantizer.

Function-level imports count as much as module-level ones: a drawing of the imports has every arrow.
"""

import ast
from pathlib import Path

import edgettt

ROOT = Path(edgettt.__file__).parent
# what a kernel may import besides other kernels: the references' plain-torch math and the storage layouts
PLAIN_TORCH_MATH = {"edgettt.formats", "edgettt.ops", "edgettt.linear_attention", "edgettt.errors"}


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
            graph[mod] |= {t for t in targets if t in mods and t not in (mod, "edgettt")}
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
            outside = {t for t in targets if not t.startswith("edgettt.kernels")}
            assert outside <= PLAIN_TORCH_MATH, f"{module} imports {sorted(outside - PLAIN_TORCH_MATH)}"
    assert "edgettt.quant" not in graph["edgettt.kernels.int4"] and graph["edgettt.formats"] == set()
