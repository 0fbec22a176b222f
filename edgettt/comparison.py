"""`edgettt compare`: several models of one size side by side, each measured as `edgettt report` measures one.

For each model: held-out bits per byte at several lengths; the drift (KLD against its own float model) of its
weights in int8, int4 (RTN and GPTQ) and a mixed-precision mix at 1.1 x the int4 model's size; each state format
that applies to it, with the decode state's bytes and its drift; CPU decode tokens/s through its int4 export at
several depths, timed in turns beside a same-size Llama (an onnxruntime-genai folder, where given); GPU decode
rows from an `edgettt bench --device cuda --json` file, where given. Writes compare.json, compare.md, the
plots and compare.html (everything in one page).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from html import escape
from pathlib import Path

import torch
from matplotlib.figure import Figure

from edgettt import benchmark
from edgettt.conversion import convert
from edgettt.data import Text
from edgettt.errors import EdgetttError
from edgettt.evaluation import evaluate, model_facts
from edgettt.families.base import LanguageModel
from edgettt.formats.state_formats import STATE_FORMATS
from edgettt.onnx import write_export
from edgettt.progress import bar
from edgettt.quant.apply import quantize_model
from edgettt.quant.config import QuantConfig
from edgettt.reporting import MARKERS, PAGE_STYLE, build_report, text_table, variants

# the shipped tiny models of each family (about 3.4M parameters each), in their deployable forms
DEFAULT_MODELS = ("ttt-linear-tiny-parallel", "ttt-mlp-tiny-parallel", "lact-w1-tiny", "gated-deltanet-tiny")
WEIGHTS = ("int8", "int4-rtn-g32", "int4-gptq-g32")
INT4 = QuantConfig("int4", 32, "rtn")  # the deployed default: the mix's budget and the export that is timed
MIX_OVER_INT4 = 1.1  # the mixed-precision budget: this many times the int4 model's bytes
DECODE_TOKENS = 64


@dataclasses.dataclass
class CompareSettings:
    bpb_ctx: tuple[int, ...] = (512, 2048, 8192)  # held-out bits per byte at these lengths
    bpb_tokens: int = 8192  # tokens measured at each length (one window of 8192)
    kld_ctx: int = 512  # the drift's windows (weights and states)
    kld_tokens: int = 4096
    calib_samples: int = 4  # windows of kld_ctx tokens (GPTQ, the mix, int8 state scales)
    depths: tuple[int, ...] = (0, 2048, 8192)  # CPU decode after this many tokens
    repetitions: int = 3
    threads: int | None = None
    speed: bool = True  # export and time each model (False: accuracy only)


def state_formats(model: LanguageModel) -> list[str]:
    """The state formats other than float32 that apply to `model`'s family."""
    return [name for name in STATE_FORMATS if name != "fp32" and model.state_format_refusal(name) is None]


def int4_copy(model: LanguageModel) -> LanguageModel:
    """A copy of `model` in the int4 default (RTN is fast, and stores what GPTQ stores)."""
    copy = convert(model, model.form)
    quantize_model(copy, INT4)
    return copy


def accuracy(model: LanguageModel, name: str, text: Text, calib_text: Text, settings: CompareSettings,
             log=print) -> dict:
    """Bits per byte at each length, and the drift of each weight and state variant (`reporting.build_report`)."""
    bits = {str(ctx): evaluate(model, name, text, ctx, settings.bpb_tokens)[0]["bits_per_byte"]
            for ctx in settings.bpb_ctx}  # (string keys: as the JSON keeps them)
    mix = f"mix:size={MIX_OVER_INT4 * model_facts(int4_copy(model), 'int4')['size_mb']:.4f}"
    report = build_report(model, name, text, calib_text, variants([*WEIGHTS, mix], state_formats(model)),
                          settings.kld_ctx, settings.kld_tokens, form=model.form, calib_samples=settings.calib_samples,
                          log=log)
    if report["failed"]:
        raise EdgetttError(f"{name}: " + "; ".join(f"{f['variant']}: {f['error']}" for f in report["failed"]))
    rows = report["rows"]
    for row in rows:  # (the report's by-position drift and the mix's search: not compared)
        for key in ("kld_by_position", "frontier", "layer_variants"):
            row.pop(key, None)
    return {"model": name, "family": model.config.family, "form": model.form,
            "parameters": sum(p.numel() for p in model.parameters()), "bits_per_byte": bits,
            "float_state_bytes": rows[0]["state_bytes"], "weights": [r for r in rows if r["state"] == "fp32"],
            "states": [r for r in rows if r["weights"] == "float" and r["state"] != "fp32"]}


def export_int4(model: LanguageModel, directory: Path, name: str) -> Path:
    """The int4 default's graphs (unverified: they are timed; `edgettt export` verifies the same graphs)."""
    directory.mkdir(parents=True)
    write_export(int4_copy(model), directory, name)
    return directory


def cpu_decode(exports: dict[str, Path], llama: Path | None, settings: CompareSettings) -> dict:
    """tg@depth rows of every export (and the Llama), in turns (`edgettt bench`)."""
    paths = [str(p) for p in exports.values()] + ([str(llama)] if llama else [])
    result = benchmark.run(paths, benchmark.tests([], [DECODE_TOKENS], list(settings.depths)), settings.repetitions,
                           settings.threads, keep_workers=True)  # (a worker a path: each loads its model once)
    names = {str(p): name for name, p in exports.items()} | ({str(llama): "llama"} if llama else {})
    rows = {}
    for row in result["rows"]:
        rows.setdefault(names[row["path"]], {})[row["test"].split("@d")[1]] = row["tokens_per_s"]
    return {"rows": rows, "meta": result["meta"]}


def gpu_decode(path: Path, names: list[str]) -> dict:
    """Decode rows of an `edgettt bench --device cuda --json` file, by model name (its paths as given there)."""
    data = json.loads(path.read_text())
    result = data.get("result", data)  # (a benchmark registry's result wraps the bench JSON)
    by_folder = {Path(name).name: name for name in names}
    rows = {}
    for row in result["rows"]:
        label = Path(row["path"]).name
        if row["test"].startswith("tg") and (label in by_folder or label.startswith("llama")):
            rows.setdefault(by_folder.get(label, label), {})[row["test"].split("@d")[1]] = row["tokens_per_s"]
    return {"rows": rows, "meta": result["meta"], "file": str(path)}


def compare(models: dict[str, LanguageModel], text: Text, calib_text: Text, settings: CompareSettings,
            llama: Path | None = None, gpu_bench: Path | None = None, sources: dict[str, str] | None = None,
            log=print) -> dict:
    """Everything `edgettt compare` measures of `models` ({name: model}), as the JSON it writes. The int4 exports
    of the models read from `sources` ({name: directory or shipped name}) are traced in a second process while
    this one measures their accuracy (a trace is one core's Python work)."""
    out = {"text": text.fingerprint(), "calibration_text": calib_text.fingerprint(),
           "settings": dataclasses.asdict(settings), "mix_over_int4": MIX_OVER_INT4, "models": []}
    with tempfile.TemporaryDirectory(prefix="edgettt-compare-") as tmp, \
            ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as exporter:
        folder = {name: Path(tmp) / f"export{i}" for i, name in enumerate(models)}
        traced = {name: exporter.submit(export_from_source, str(source), str(folder[name]), name)
                  for name, source in (sources or {}).items() if settings.speed}
        with threads_beside(1 if traced else 0):
            for name, model in bar(models.items(), desc="models", unit="model", leave=False):
                log(f"{name}: bits per byte at {', '.join(map(str, settings.bpb_ctx))} tokens; weight and state drift")
                out["models"].append(accuracy(model, name, text, calib_text, settings, log=lambda line: None))
        if settings.speed:
            for name, model in models.items():
                if name not in traced:
                    log(f"{name}: exporting int4 for the CPU decode")
                    export_int4(model, folder[name], name)
            for future in traced.values():
                future.result()  # (raises what the export raised)
            log(f"timing CPU decode at depths {', '.join(map(str, settings.depths))}, in turns"
                + (f" beside {llama}" if llama else ""))
            out["cpu_decode"] = cpu_decode(folder, llama, settings)
    if gpu_bench is not None:
        out["gpu_decode"] = gpu_decode(gpu_bench, list(models))
    return out


@contextlib.contextmanager
def threads_beside(busy: int):
    """torch's threads less `busy` (the exporter process's core) for a while: a thread that waits for a busy
    core costs more than it gives (the four tiny models compared on 2 cores: 609 s with 2 threads beside the
    exporter, 401 s with 1; docs/compare.md)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads - busy))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def export_from_source(source: str, directory: str, name: str) -> str:
    """`export_int4` of the model at `source`, in an exporter process (one thread: the other core measures)."""
    import torch

    from edgettt.checkpoint import load_model

    torch.set_num_threads(1)
    return str(export_int4(load_model(source), Path(directory), name))


def _fmt(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def weight_row(m: dict, weights: str) -> dict | None:
    return next((r for r in m["weights"] if r["weights"] == weights or r["variant"].startswith(f"w-{weights} ")),
                None)


def tables(data: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, head, rows) of each table the page, the Markdown and the terminal show."""
    models = data["models"]
    ctxs = data["settings"]["bpb_ctx"]
    out = [("Held-out bits per byte (lower is better)", ["model", "family", "parameters", *(f"{c} tokens" for c in ctxs)],
            [[m["model"], m["family"], f"{m['parameters']:,}", *(_fmt(m["bits_per_byte"].get(str(c)), ".4f") for c in ctxs)]
             for m in models])]
    kinds = [*WEIGHTS, "mixed"]
    out.append((f"Weights: mean KLD against the model's own float weights (MB); mixed: at {data['mix_over_int4']} x "
                "the int4 model's size",
                ["model", *kinds],
                [[m["model"], *(_fmt_weight(weight_row(m, k)) for k in kinds)] for m in models]))
    formats = sorted({r["state"] for m in models for r in m["states"]}, key=list(STATE_FORMATS).index)
    out.append(("Decode state: bytes a sequence (% of float32) and mean KLD; - where a format does not apply",
                ["model", "fp32 bytes", *formats],
                [[m["model"], f"{m['float_state_bytes']:,}", *(_fmt_state(m, f) for f in formats)] for m in models]))
    for key, title in (("cpu_decode", "CPU decode tokens/s (int4 export, onnxruntime) after D tokens"),
                       ("gpu_decode", "GPU decode tokens/s after D tokens")):
        if key in data:
            rows = data[key]["rows"]
            depths = sorted({int(d) for r in rows.values() for d in r})
            out.append((title, ["model", *(f"d{d}" for d in depths)],
                        [[name, *(_fmt(r.get(str(d)), ".1f") for d in depths)] for name, r in rows.items()]))
    return out


def _fmt_weight(row: dict | None) -> str:
    return "-" if row is None else f"{row['kld_mean']:.5f} ({row['size_mb']:.2f})"


def _fmt_state(m: dict, fmt: str) -> str:
    row = next((r for r in m["states"] if r["state"] == fmt), None)
    if row is None:
        return "-"
    return f"{100 * row['state_bytes'] / m['float_state_bytes']:.0f}%, {row['kld_mean']:.2e}"


def terminal(data: dict) -> str:
    return "\n\n".join(f"{title}\n{text_table(head, rows)}" for title, head, rows in tables(data))


PLOTS = ("bits_per_byte.png", "weights_kld.png", "state_kld.png", "cpu_decode.png")


def plot(data: dict, out: Path) -> list[str]:
    """The plots (files in `out`) that have data: bits per byte by length, weight and state drift, CPU decode."""
    made, models = [], data["models"]
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for i, m in enumerate(models):
        ctxs = sorted(int(c) for c in m["bits_per_byte"])
        ax.plot(ctxs, [m["bits_per_byte"][str(c)] for c in ctxs], marker=MARKERS[i],
                label=m["model"])
    ax.set(xscale="log", xlabel="tokens a window", ylabel="bits per byte (lower is better)", title="held-out text")
    _save(fig, ax, out / PLOTS[0], made)
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    kinds = [*WEIGHTS, "mixed"]
    width = 0.8 / max(len(models), 1)
    for i, m in enumerate(models):
        klds = [(weight_row(m, k) or {}).get("kld_mean", float("nan")) for k in kinds]
        ax.bar([j + i * width for j in range(len(kinds))], klds, width, label=m["model"])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(kinds))], kinds)
    ax.set(yscale="log", ylabel="mean KLD against float (lower is better)", title="weights")
    _save(fig, ax, out / PLOTS[1], made)
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for i, m in enumerate(models):
        shown = [r for r in m["states"] if r["kld_mean"] > 0]
        ax.scatter([100 * r["state_bytes"] / m["float_state_bytes"] for r in shown], [r["kld_mean"] for r in shown],
                   marker=MARKERS[i], s=50, label=m["model"])
        for r in shown:
            ax.annotate(r["state"], (100 * r["state_bytes"] / m["float_state_bytes"], r["kld_mean"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set(yscale="log", xlabel="decode state, % of float32's bytes", ylabel="mean KLD (lower is better)",
           title="state formats")
    _save(fig, ax, out / PLOTS[2], made)
    if "cpu_decode" in data:
        fig = Figure(figsize=(7, 4))
        ax = fig.subplots()
        for i, (name, row) in enumerate(data["cpu_decode"]["rows"].items()):
            depths = sorted(int(d) for d in row)
            ax.plot(depths, [row[str(d)] for d in depths], marker=MARKERS[i % len(MARKERS)],
                    label=name, linestyle="--" if name == "llama" else "-")
        ax.set(xlabel="tokens of context before decoding", ylabel="tokens/s (higher is better)",
               title="CPU decode, int4 exports")
        _save(fig, ax, out / PLOTS[3], made)
    return made


def _save(fig: Figure, ax, path: Path, made: list[str]) -> None:
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    made.append(path.name)


def markdown(data: dict) -> str:
    t = data["text"]
    lines = ["# Models compared", "", f"Text {t['name']} ({t['bytes']:,} bytes, sha256 {t['sha256']}).", ""]
    for title, head, rows in tables(data):
        lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    return "\n".join(lines)


def html(data: dict, out: Path, images: list[str]) -> str:
    sections = "".join(
        f"<h2>{escape(title)}</h2><table><thead><tr>{''.join(f'<th>{escape(h)}</th>' for h in head)}</tr></thead>"
        f"<tbody>{''.join('<tr>' + ''.join(f'<td>{escape(c)}</td>' for c in r) + '</tr>' for r in rows)}</tbody></table>"
        for title, head, rows in tables(data))
    figures = "".join(f'<figure><img alt="{name}" src="data:image/png;base64,'
                      f'{base64.b64encode((out / name).read_bytes()).decode()}"></figure>' for name in images)
    sources = ""
    if "cpu_decode" in data:
        meta = data["cpu_decode"]["meta"]
        sources += f"<p>CPU: {escape(str(meta.get('cpu')))}, {meta.get('threads')} threads, medians of {meta.get('repetitions')} rounds in turns.</p>"
    if "gpu_decode" in data:
        sources += f"<p>GPU rows from {escape(data['gpu_decode']['file'])} ({escape(str(data['gpu_decode']['meta'].get('gpu', '')))}).</p>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edgettt compare</title>
<style>
{PAGE_STYLE}
img {{ max-width: 100%; }}
</style></head><body>
<h1>Models compared</h1>
<p>Text {escape(data['text']['name'])}; drift against each model's own float weights on windows of
{data['settings']['kld_ctx']} tokens.</p>
{sources}{sections}{figures}
<p>Made by edgettt compare.</p>
</body></html>
"""


def write(data: dict, out: Path) -> None:
    (out / "compare.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "compare.md").write_text(markdown(data))
    (out / "compare.html").write_text(html(data, out, plot(data, out)))
