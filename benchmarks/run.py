"""The lab's one runner: runs a benchmark of `registry.BENCHMARKS` and writes its one current result.

    python benchmarks/run.py list                     every benchmark: device, result, what it measures
    python benchmarks/run.py run NAME [NAME ...]      run them; results/NAME.json and NAME.md (or NAME.txt)
    python benchmarks/run.py run NAME --results DIR   write elsewhere (a trial: results/ keeps the current one)
    python benchmarks/run.py run NAME --extra "--repeats 1"   append arguments to the benchmark's command

A result's JSON is {"benchmark", "command", "device", "versions", "result": what the script wrote}; its
Markdown opens with the same facts, then the script's table (or one made from the result's rows). Each
file is written under a temporary name and renamed when complete; a failed run leaves the old result.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).parent))
from registry import BENCHMARKS, benchmark, result_files  # noqa: E402  (beside this script)

from edgettt.benchmark.plan import cpu_name  # noqa: E402  (plain Python)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = ("torch", "triton", "onnxruntime", "onnxruntime-genai", "bitsandbytes", "fla-core", "numpy")


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def device_name(kind: str) -> str:
    """The machine a result was measured on, in words."""
    if kind == "cuda":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
        return "no CUDA GPU found"
    return f"{cpu_name()}, {os.cpu_count()} cores" + (" (offline: compiled for sm_90a)" if kind == "offline" else "")


def markdown_table(rows: list[dict]) -> str:
    """A result's rows (dicts) as a Markdown table, the keys of the first row as columns."""
    keys = [k for k in rows[0] if not isinstance(rows[0][k], (dict, list))]

    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def run_one(name: str, results: Path, extra: str) -> list[Path]:
    b = benchmark(name)
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        files = {"json": f"{tmp}/result.json", "md": f"{tmp}/result.md", "tmp": tmp}
        command = b.command.format(**files) + (f" {extra}" if extra else "")
        shown = b.command.format(json=f"benchmarks/results/{name}.json", md=f"benchmarks/results/{name}.md",
                                 tmp="$TMP") + (f" {extra}" if extra else "")
        click.echo(f"{name}: {shown}", err=True)
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, text=True, env=env,  # this Python's tools first
                              stdout=subprocess.PIPE if b.writes_text else None)
        if done.returncode != 0:
            raise click.ClickException(f"{name}: the command exited with {done.returncode}; results/{name}.* kept")
        facts = {"benchmark": name, "command": shown, "device": device_name(b.device), "versions": versions()}
        header = (f"# {name}\n\n{b.about}\n\nCommand: `{shown}`\n\nDevice: {facts['device']}; "
                  + ", ".join(f"{k} {v}" for k, v in facts["versions"].items()) + "\n\n")
        results.mkdir(parents=True, exist_ok=True)
        if b.writes_text:
            out = results / f"{name}.txt"
            write_atomically(out, header + done.stdout)
            return [out]
        data = json.loads(Path(files["json"]).read_text()) if "{json}" in b.command else None
        table = Path(files["md"]).read_text() if Path(files["md"]).exists() else (
            markdown_table(data["rows"]) if isinstance(data, dict) and data.get("rows") else
            f"The rows are in `{name}.json`.") + "\n"
        written = [results / f"{name}.md"]
        write_atomically(written[0], header + table)
        if data is not None:
            written.append(results / f"{name}.json")
            write_atomically(written[1], json.dumps({**facts, "result": data}, indent=2) + "\n")
        return written


@click.group()
def main():
    """The lab's benchmarks: list them, run them."""


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_cmd(as_json):
    """Every benchmark, its device, its current result's files and what it measures."""
    rows = [{"name": b.name, "device": b.device, "result": result_files(b),
             "present": (RESULTS / result_files(b)[0]).exists(), "about": b.about} for b in BENCHMARKS]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['name']:30s} {r['device']:8s} {'' if r['present'] else '(no result yet) '}{r['about']}")


@main.command("run")
@click.argument("names", nargs=-1, required=True)
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=RESULTS, show_default=True,
              help="Folder the results are written to.")
@click.option("--extra", default="", help="Arguments appended to each benchmark's command.")
def run_cmd(names, results, extra):
    """Run the benchmarks NAMES in turn and write their results."""
    known = {b.name for b in BENCHMARKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: not in the registry (python benchmarks/run.py list)",
                                 param_hint="NAMES")
    for name in names:
        for path in run_one(name, results, extra):
            click.echo(f"wrote {path}")


if __name__ == "__main__":
    main()
