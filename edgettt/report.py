"""`edgettt report`: the whole chain and the accuracy-vs-bits table.

convert (when given a TTT checkpoint) -> calibrate -> quantize every variant -> evaluate each
against the unquantized converted model (saved reference logits) and the original. Writes
report.json (a list `rows`), report.csv, report.md and two PNG plots.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

from . import metrics
from .calibration import calibrate
from .conversion import convert
from .data import Text, token_windows
from .errors import EdgetttError
from .evaluate import collect_logits, encode, model_facts, target_bytes
from .model import CausalLM
from .quantize import QuantConfig, apply_state_format, quantize_


@dataclasses.dataclass
class Variant:
    weights: str  # int8 | int4 | nf4 | fp4 | none
    method: str = "rtn"
    group_size: int = 64
    state: str = "fp32"

    @property
    def name(self) -> str:
        w = {"none": "w-float"}.get(self.weights, f"w-{self.weights}")
        if self.weights == "int4":
            w += f"-{self.method}-g{self.group_size}"
        elif self.method != "rtn":
            w += f"-{self.method}"
        elif self.weights in ("nf4", "fp4"):
            w += f"-b{self.group_size}"
        return f"{w} s-{self.state}"

    def config(self) -> QuantConfig:
        return QuantConfig(self.weights, self.group_size, self.method, self.state)


def variants(weights: list[str], states: list[str], group_size: int) -> list[Variant]:
    """Every weight format with a float state, then every state format with float weights."""
    out = []
    for w in weights:
        fmt, _, method = w.partition("-") if w.endswith(("-rtn", "-gptq")) else (w, "", "")
        method = method or "rtn"
        out.append(Variant(fmt, method, group_size))
    out += [Variant("none", state=s) for s in states if s != "fp32"]
    return out


def build_report(source: CausalLM, source_name: str, text: Text, calib_text: Text, variant_list: list[Variant],
                 ctx: int, max_tokens: int, form: str = "exact", calib_samples: int = 4, onnx: bool = False,
                 log=print) -> dict:
    """With `onnx`, every row also gets its ONNX files' sizes and onnxruntime CPU tokens/s (parallel form)."""
    original = source
    converted = convert(source, form) if source.form == "ttt" else source
    if onnx:
        if converted.form != "parallel":
            raise EdgetttError(f"{source_name}: --onnx exports the parallel form only, this is {converted.form!r}; "
                               "pass --form parallel (or a parallel-form model such as ttt-linear-tiny-parallel)")
        from .export.speed import onnx_speed  # onnx and onnxscript only when asked for
    windows = token_windows(encode(converted, text), ctx, max_tokens)
    targets, n_bytes = windows[:, 1:], target_bytes(converted, windows)
    log(f"reference logits: {converted.form} form on {text.name}, {windows.shape[0]} x {ctx} tokens")
    ref_logits = collect_logits(converted, windows, desc="reference")
    orig_ppl = metrics.perplexity(collect_logits(original, windows, desc="original"), targets, n_bytes) \
        if original is not converted else None
    log(f"calibrating on {calib_text.name} ({calib_samples} x {ctx} tokens)")
    cal = calibrate(converted, calib_text, seq_len=ctx, samples=calib_samples)
    rows = [_row("float (converted)", "float", "fp32", model_facts(converted, "ref"),
                 metrics.drift(ref_logits, ref_logits, targets, n_bytes), None)]
    if onnx:
        rows[0].update(onnx_speed(converted))
    for v in variant_list:
        model = convert(converted, converted.form)  # a fresh copy
        quantize_(model, v.config(), cal.hessians)
        apply_state_format(model, v.state, cal)
        model.config.quantization = v.config().to_dict()
        d = metrics.drift(ref_logits, collect_logits(model, windows, desc=v.name), targets, n_bytes)
        rows.append(_row(v.name, v.weights if v.weights != "none" else "float", v.state, model_facts(model, v.name),
                         d, orig_ppl))
        if onnx:
            rows[-1].update(onnx_speed(model))
        log(f"  {v.name:28s} {rows[-1]['size_mb']:6.2f} MB  KLD {d['kld_mean']:.5f}  top-1 {100 * d['top1']:.2f}%")
    return {"model": source_name, "form": converted.form, "text": text.fingerprint(),
            "calibration_text": calib_text.fingerprint(), "ctx": ctx, "windows": windows.shape[0],
            "original": orig_ppl, "rows": rows}


def _row(name, weights, state, facts, d, orig_ppl) -> dict:
    return {
        "variant": name, "weights": weights, "state": state, "size_mb": facts["size_mb"],
        "bits_per_weight": facts["bits_per_weight"], "ppl": d["model"]["ppl"],
        "bits_per_byte": d["model"].get("bits_per_byte"), "dppl_pct": 100 * (d["ppl_ratio"] - 1),
        "dppl_vs_original_pct": 100 * (d["model"]["ppl"] / orig_ppl["ppl"] - 1) if orig_ppl else None,
        "kld_mean": d["kld_mean"], "kld_stderr": d["kld_stderr"], "kld_p99": d["kld_p99"], "kld_max": d["kld_max"],
        "top1": d["top1"], "rms_dp": d["rms_dp"], "kld_by_position": d["kld_by_position"],
    }


COLUMNS = [("variant", "{}"), ("weights", "{}"), ("state", "{}"), ("size_mb", "{:.2f}"), ("bits_per_weight", "{:.2f}"),
           ("ppl", "{:.4f}"), ("dppl_pct", "{:+.2f}"), ("kld_mean", "{:.5f}"), ("kld_p99", "{:.4f}"),
           ("top1", "{:.2%}"), ("rms_dp", "{:.3%}")]


ONNX_COLUMNS = [("onnx_decode_mb", "{:.2f}"), ("ort_prefill_tokens_per_s", "{:.0f}"),
                ("ort_decode_tokens_per_s", "{:.1f}")]


def columns(report: dict) -> list[tuple[str, str]]:
    return COLUMNS + (ONNX_COLUMNS if "onnx_decode_mb" in report["rows"][0] else [])


def table(report: dict) -> str:
    head = ["variant", "weights", "state", "MB", "bits/w", "PPL", "dPPL %", "KLD mean", "KLD p99", "top-1", "RMS dp"]
    if "onnx_decode_mb" in report["rows"][0]:
        head += ["decode.onnx MB", "ORT prefill tok/s", "ORT decode tok/s"]
    body = [[fmt.format(row[key]) for key, fmt in columns(report)] for row in report["rows"]]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in body])


def write(report: dict, out: Path) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(out / "report.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([k for k, _ in columns(report)] + ["kld_by_position"])
        for row in report["rows"]:
            writer.writerow([row[k] for k, _ in columns(report)] + [" ".join(f"{x:.6g}" for x in row["kld_by_position"])])
    t = report["text"]
    md = [f"# Accuracy vs bits: {report['model']} ({report['form']} form)", "",
          f"Text {t['name']} ({t['bytes']} bytes, sha256 {t['sha256']}), {report['windows']} windows x "
          f"{report['ctx']} tokens; reference: the unquantized converted model.", ""]
    md += ["| " + " | ".join(k for k, _ in columns(report)) + " |", "|" + "---|" * len(columns(report))]
    md += ["| " + " | ".join(fmt.format(r[k]) for k, fmt in columns(report)) + " |" for r in report["rows"]]
    md += ["", "KLD by position bucket (first to last):", ""]
    md += [f"- {r['variant']}: " + ", ".join(f"{x:.5f}" for x in r["kld_by_position"]) for r in report["rows"]]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plot(report, out)


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        ax.scatter(r["size_mb"], max(r["kld_mean"], 1e-7))
        ax.annotate(r["variant"], (r["size_mb"], max(r["kld_mean"], 1e-7)), fontsize=7)
    ax.set(xlabel="weights, MB", ylabel="KLD mean vs float (log)", yscale="log", title="Accuracy against size")
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_size.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows[1:]:
        ax.plot(range(1, len(r["kld_by_position"]) + 1), r["kld_by_position"], marker="o", label=r["variant"])
    ax.set(xlabel=f"position bucket (of {report['ctx']} tokens)", ylabel="KLD mean", yscale="log",
           title="Drift along the text")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "kld_by_position.png", dpi=120)
    plt.close(fig)

