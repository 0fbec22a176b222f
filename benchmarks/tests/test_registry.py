"""The lab's registry and runner, through the runner's command line (no benchmark script imported)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent
RESULTS = BENCHMARKS / "results"
sys.path.insert(0, str(BENCHMARKS))
from registry import BENCHMARKS as REGISTERED, STUDIES, result_files  # noqa: E402


def runner(*args, cwd=None):
    return subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), *args], capture_output=True, text=True,
                          cwd=cwd)


def test_every_result_file_is_a_registered_benchmarks_one_current_result():
    """results/ holds each benchmark's current result and the named study write-ups, nothing else: no run,
    trial or date in a file name (history is in git)."""
    allowed = {f for b in REGISTERED for f in result_files(b)} | set(STUDIES)
    assert sorted(p.name for p in RESULTS.iterdir() if p.name not in allowed) == []
    assert len({b.name for b in REGISTERED}) == len(REGISTERED)


def test_every_registered_command_names_a_script_that_exists():
    for b in REGISTERED:
        for word in b.command.replace("&&", " ").split():
            if word.startswith("benchmarks/"):
                assert (BENCHMARKS.parent / word).is_file(), (b.name, word)
        assert b.device in ("cpu", "cuda", "offline"), b.name


def test_the_runner_lists_every_benchmark():
    listed = json.loads(runner("list", "--json").stdout)
    assert [r["name"] for r in listed] == [b.name for b in REGISTERED]


def test_the_runner_writes_a_result_with_its_device_versions_and_command(tmp_path):
    """train_step_cpu at a tiny size (the arguments appended to its command), into a scratch folder."""
    done = runner("run", "train_step_cpu", "--results", str(tmp_path), "--extra", "--batch 1 --ctx 32 --repeats 1")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "train_step_cpu.json").read_text())
    assert result["benchmark"] == "train_step_cpu" and "bench_train_step.py" in result["command"]
    assert "torch" in result["versions"] and "cores" in result["device"] and result["result"]["rows"]
    md = (tmp_path / "train_step_cpu.md").read_text()
    assert md.startswith("# train_step_cpu") and "Command: `" in md and "| " in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_step_cpu.json", "train_step_cpu.md"]


@pytest.mark.parametrize("name", ["no-such-benchmark"])
def test_an_unknown_benchmark_is_a_one_line_error(name, tmp_path):
    done = runner("run", name, "--results", str(tmp_path))
    assert done.returncode == 2 and "not in the registry" in done.stderr and not any(tmp_path.iterdir())


def test_no_test_imports_a_benchmark_script():
    """Tests (the core's and the lab's) import the lab's library (`lab`), never a script: a script is a command."""
    import ast

    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - {"registry"}
    found = []
    for test in [*BENCHMARKS.parent.glob("tests/**/*.py"), *BENCHMARKS.glob("tests/*.py")]:
        for node in ast.walk(ast.parse(test.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            found += [f"{test.name}: {n}" for n in names if n.split(".")[0] in scripts]
    assert found == []
