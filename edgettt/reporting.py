"""`edgettt report`: the whole chain and the accuracy-vs-bits table.

convert (when given a TTT checkpoint) -> calibrate -> quantize every variant -> evaluate each
against the unquantized converted model (saved reference logits) and the original. Writes
report.json (a list `rows`, and `failed`: variants that did not finish), report.csv, report.md, three PNG
plots and report.html (all of it in one page, the plots inlined).
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import json
import math
from html import escape
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from edgettt import metrics
from edgettt.conversion import convert
from edgettt.data import Text, token_windows
from edgettt.errors import EdgetttError
from edgettt.evaluation import collect_logits, encode, model_facts, target_bytes
from edgettt.families.base import LanguageModel
from edgettt.onnx.speed import onnx_speed
from edgettt.progress import bar
from edgettt.quant.apply import layer_formats, quantize_model
from edgettt.calibration.statistics import calibrate
from edgettt.quant.config import DEFAULT_SKIP, QuantConfig, weight_variant
from edgettt.calibration.mixed import Budget, search_mix


@dataclasses.dataclass
class Variant:
    weights: str  # a weight format's name, or none
    method: str = "rtn"
    group_size: int = 64
    state: str = "fp32"
    skip: tuple[str, ...] = DEFAULT_SKIP
    fallback: str = "int8"
    target: str = ""  # a mixed-precision budget (size=MB or kld=X): the layers' formats are searched for it

    @property
    def name(self) -> str:
        return f"w-{self.config().variant} s-{self.state}"

    def config(self) -> QuantConfig:
        return QuantConfig(self.weights, self.group_size, self.method, self.state, skip=self.skip,
                           fallback=self.fallback, target=self.target)


MIX_PREFIX = "mix:"  # a report's weight variant "mix:size=2.5": the mix `quantize --target size=2.5` makes


def weight_variant_or_mix(name: str) -> Variant:
    """A report's weight variant: a format's spelling (int4-gptq-g64) or a mixed-precision budget (mix:size=2.5)."""
    if name.startswith(MIX_PREFIX):
        return Variant("int4", "gptq", target=str(Budget.parse(name[len(MIX_PREFIX):], f"--weights {name}")))
    return Variant(*weight_variant(name))


def variants(weights: list[str], states: list[str], skip: tuple[str, ...] = DEFAULT_SKIP,
             fallback: str = "int8") -> list[Variant]:
    """Every weight variant (a name `quant.config.weight_variant` reads: int4-gptq-g64, or mix:size=MB /
    mix:kld=X) with a float state, then every state format with float weights."""
    out = [dataclasses.replace(weight_variant_or_mix(w), skip=skip, fallback=fallback) for w in weights]
    out += [Variant("none", state=s, skip=skip, fallback=fallback) for s in states if s != "fp32"]
    return out


def build_report(source: LanguageModel, source_name: str, text: Text, calib_text: Text, variant_list: list[Variant],
                 ctx: int, max_tokens: int, form: str = "exact", calib_samples: int = 4, onnx: bool = False,
                 log=print, keep_exports: Path | None = None) -> dict:
    """With `onnx`, every row also gets its ONNX files' sizes and onnxruntime CPU tokens/s (parallel form);
    with `keep_exports`, each variant's export stays in that folder. A variant that fails is listed
    under "failed" with its error; the rows finished before and after it are kept."""
    original = source
    converted = convert(source, form) if source.form == "ttt" else source
    for v in variant_list:  # a format that cannot take a layer, with fallback "refuse": before any work
        if v.weights != "none" and not v.target:
            layer_formats(converted, v.config())
    if onnx:
        if converted.form != "parallel":
            raise EdgetttError(f"{source_name}: --onnx exports the parallel form only, this is {converted.form!r}; "
                               "pass --form parallel (or a parallel-form model such as ttt-linear-tiny-parallel)")
    windows = token_windows(encode(converted, text), ctx, max_tokens)
    targets, n_bytes = windows[:, 1:], target_bytes(converted, windows)
    log(f"reference logits: {converted.form} form on {text.name}, {windows.shape[0]} x {ctx} tokens")
    ref_logits = collect_logits(converted, windows, desc="reference")
    orig_ppl = metrics.perplexity(collect_logits(original, windows, desc="original"), targets, n_bytes) \
        if original is not converted else None
    log(f"calibrating on {calib_text.name} ({calib_samples} x {ctx} tokens)")
    cal = calibrate(converted, calib_text, ctx, samples=calib_samples)
    rows = [_row("float (converted)", "float", "fp32", model_facts(converted, "ref"),
                 metrics.drift(ref_logits, ref_logits, targets, n_bytes), None)]
    keep = (lambda name: keep_exports / name.replace(" ", "_")) if keep_exports else (lambda name: None)
    if onnx:
        rows[0].update(onnx_speed(converted, keep=keep("float")))
    failed = []
    for v in bar(variant_list, desc="variants", unit="variant", leave=False):
        try:
            rows.append(_variant_row(v, converted, cal, ref_logits, windows, n_bytes, orig_ppl, calib_text))
            if onnx:
                rows[-1].update(onnx_speed(rows[-1].pop("_model"), keep=keep(v.name)))
        except EdgetttError as exc:  # the other variants still count
            failed.append({"variant": v.name, "error": str(exc)})
            log(f"  {v.name:28s} failed: {exc}")
            continue
        rows[-1].pop("_model", None)
        r = rows[-1]
        log(f"  {v.name:28s} {r['size_mb']:6.2f} MB  KLD {r['kld_mean']:.5f}  top-1 {100 * r['top1']:.2f}%"
            + (f"  ({r['fallback_layers']} layers in {v.fallback})" if r.get("fallback_layers") else ""))
    return {"model": source_name, "form": converted.form, "text": text.fingerprint(),
            "calibration_text": calib_text.fingerprint(), "ctx": ctx, "windows": windows.shape[0],
            "original": orig_ppl, "rows": rows, "failed": failed}


def _variant_row(v: Variant, converted: LanguageModel, cal, ref_logits, windows, n_bytes, orig_ppl, calib_text) -> dict:
    model = convert(converted, converted.form)  # a fresh copy
    plan = search_mix(converted, cal, calib_text, Budget.parse(v.target), v.state) if v.target else None
    layers = quantize_model(model, plan.config() if plan else v.config(), cal)
    d = metrics.drift(ref_logits, collect_logits(model, windows, desc=v.name), windows[:, 1:], n_bytes)
    weights = "mixed" if v.target else "float" if v.weights == "none" else v.weights
    row = _row(v.name, weights, v.state, model_facts(model, v.name), d, orig_ppl)
    row["fallback_layers"] = sum(1 for layer in layers if layer.get("fallback"))
    if plan:  # the search's frontier (predicted on the calibration text) for the size-against-KLD plot
        row.update(frontier=plan.frontier, predicted_kld=plan.predicted_kld, layer_variants=plan.choices)
    row["_model"] = model
    return row


def _row(name, weights, state, facts, d, orig_ppl) -> dict:
    return {
        "variant": name, "weights": weights, "state": state, "size_mb": facts["size_mb"],
        "bits_per_weight": facts["bits_per_weight"], "ppl": d["model"]["ppl"],
        "bits_per_byte": d["model"].get("bits_per_byte"), "dppl_pct": 100 * (d["ppl_ratio"] - 1),
        "dppl_vs_original_pct": 100 * (d["model"]["ppl"] / orig_ppl["ppl"] - 1) if orig_ppl else None,
        "kld_mean": d["kld_mean"], "kld_stderr": d["kld_stderr"], "kld_p99": d["kld_p99"], "kld_max": d["kld_max"],
        "top1": d["top1"], "rms_dp": d["rms_dp"], "kld_by_position": d["kld_by_position"],
        "state_bytes": facts.get("state_bytes"),  # a sequence's decode state as its format keeps it
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
    return text_table(head, [[fmt.format(row[key]) for key, fmt in columns(report)] for row in report["rows"]])


def text_table(head: list[str], rows: list[list[str]]) -> str:
    """A terminal table: the first column left-aligned, the others right-aligned, a rule under the head."""
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


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
    (out / "report.html").write_text(html(report, out))


def variant_colours(report: dict) -> dict[str, tuple]:
    """One colour per variant, the same in every plot and in the HTML table; the float model in black."""
    palette = matplotlib.colormaps["tab10" if len(report["rows"]) <= 11 else "tab20"]
    colours = {r["variant"]: palette(i % palette.N) for i, r in enumerate(report["rows"][1:])}
    colours[report["rows"][0]["variant"]] = (0.0, 0.0, 0.0, 1.0)
    return colours


MARKERS = "osD^v<>phX*"
LINES = ("-", "--", "-.", ":")


def dodged(xs: list[float], ys: list[float], near_x: float = 0.02, near_decades: float = 0.1,
           step: float = 0.025) -> list[float]:
    """xs moved apart where points of a log-y scatter would cover each other: each group of points within
    `near_x` of the x range and `near_decades` of each other is spread around its place, `step` of the x
    range apart (the table and the legend keep the true sizes)."""
    if not xs:
        return []
    span = (max(xs) - min(xs)) or 1.0
    out = list(xs)
    groups: list[list[int]] = []
    for i in range(len(xs)):
        for g in groups:
            j = g[0]
            if abs(xs[i] - xs[j]) < near_x * span and abs(math.log10(ys[i]) - math.log10(ys[j])) < near_decades:
                g.append(i)
                break
        else:
            groups.append([i])
    for g in groups:
        for k, i in enumerate(g):
            out[i] = xs[i] + (k - (len(g) - 1) / 2) * step * span
    return out


def plot(report: dict, out: Path) -> None:
    """accuracy_vs_size.png (KLD against size, lower is better), kld_by_position.png (drift along the text) and
    state_vs_kld.png (the state formats' bytes against their drift).
    Figures without pyplot: nothing of a caller's matplotlib state (its backend, open figures) is touched."""
    rows, colours = report["rows"], variant_colours(report)
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    ref = rows[0]  # the float model: KLD 0 against itself, which a log axis cannot show: a line at its size
    ax.axvline(ref["size_mb"], color="black", linestyle=":", linewidth=1)
    ax.text(ref["size_mb"], 0.98, f" {ref['variant']}: KLD 0 (the reference)", transform=ax.get_xaxis_transform(),
            ha="right", va="top", fontsize=8, rotation=90)
    shown = [r for r in rows[1:] if r["kld_mean"] > 0]  # (0: no drift, nothing a log axis can place)
    x_of = dict(zip((r["variant"] for r in shown), dodged([r["size_mb"] for r in shown], [r["kld_mean"] for r in shown])))
    for i, r in enumerate(rows[1:]):
        if r["variant"] not in x_of:
            continue
        ax.scatter(x_of[r["variant"]], r["kld_mean"], color=colours[r["variant"]], marker=MARKERS[i % len(MARKERS)], s=60,
                   label=f"{r['variant']} ({r['size_mb']:.2f} MB, KLD {r['kld_mean']:.2g})", zorder=3)
    right = 1.5 * max(r["size_mb"] for r in rows)  # (a frontier goes on to every layer in float32)
    for r in rows[1:]:
        if r.get("frontier"):  # a mix: the best predicted KLD the search found for each size
            xs, ys = zip(*[(size, kld) for size, kld in r["frontier"] if kld > 0 and size <= right])
            ax.plot(xs, ys, color=colours[r["variant"]], linestyle="--", linewidth=1, drawstyle="steps-post",
                    label=f"{r['variant']}: predicted frontier (calibration text)")
    ax.set(xlabel="weights on disk, MB", ylabel="mean KLD against the float model (log; lower is better)",
           yscale="log", title=f"{report['model']}: drift against size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.savefig(out / "accuracy_vs_size.png", dpi=120, bbox_inches="tight")
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    for i, r in enumerate(rows[1:]):
        n = len(r["kld_by_position"])
        centres = [(b + 0.5) * report["ctx"] / n for b in range(n)]  # the bucket's middle token position
        ax.plot(centres, r["kld_by_position"], color=colours[r["variant"]], marker=MARKERS[i % len(MARKERS)],
                linestyle=LINES[i % len(LINES)], markersize=4, label=r["variant"])
    ax.set(xlabel="token position in the window", ylabel="mean KLD against the float model (log)", yscale="log",
           title=f"{report['model']}: drift along the text (windows of {report['ctx']} tokens)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.savefig(out / "kld_by_position.png", dpi=120, bbox_inches="tight")
    plot_states(report, out, colours)


def plot_states(report: dict, out: Path, colours: dict) -> None:
    """state_vs_kld.png: the state variants' KLD against their decode state's bytes, as a share of the float
    state's (the variants with float weights and another state format)."""
    rows, ref = report["rows"], report["rows"][0]
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    states = [r for r in rows[1:] if r["weights"] == "float" and r["state"] != "fp32" and r.get("state_bytes")
              and r["kld_mean"] > 0]
    for i, r in enumerate(states):
        share = 100 * r["state_bytes"] / ref["state_bytes"]
        ax.scatter(share, r["kld_mean"], color=colours[r["variant"]], marker=MARKERS[i % len(MARKERS)], s=60,
                   label=f"{r['state']} ({share:.1f}%, KLD {r['kld_mean']:.2g})", zorder=3)
    if not states:
        ax.text(0.5, 0.5, "no state variants in this report", transform=ax.transAxes, ha="center")
    ax.set(xlabel="decode state a sequence, % of the float32 state's bytes",
           ylabel="mean KLD against the float model (log; lower is better)", yscale="log",
           title=f"{report['model']}: state formats, bytes against drift ({report['ctx']} tokens)")
    ax.grid(True, which="both", alpha=0.3)
    if states:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.savefig(out / "state_vs_kld.png", dpi=120, bbox_inches="tight")


# the pages' tables (report.html, compare.html): numbers right-aligned, the first column left
PAGE_STYLE = """body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f4f4; }"""


def html(report: dict, out: Path) -> str:
    """One self-contained page: the summary, the table, drift by position, the plots inlined (offline)."""
    colours = variant_colours(report)
    head = ["variant", "weights", "state", "MB", "bits/w", "PPL", "dPPL %", "KLD mean", "KLD p99", "top-1", "RMS dp"]
    head += ["decode.onnx MB", "ORT prefill tok/s", "ORT decode tok/s"] if "onnx_decode_mb" in report["rows"][0] else []

    def swatch(name):
        r, g, b, _ = (int(255 * c) for c in colours[name])
        return f'<span class="sw" style="background:rgb({r},{g},{b})"></span>'

    rows = "".join("<tr>" + "".join(
        f"<td>{swatch(row['variant']) if key == 'variant' else ''}{escape(fmt.format(row[key]))}</td>"
        for key, fmt in columns(report)) + "</tr>" for row in report["rows"])
    n = len(report["rows"][0]["kld_by_position"])
    drift_head = "".join(f"<th>{int(b * report['ctx'] / n)}-{int((b + 1) * report['ctx'] / n) - 1}</th>" for b in range(n))
    drift = "".join(f"<tr><td>{swatch(r['variant'])}{escape(r['variant'])}</td>"
                    + "".join(f"<td>{x:.5f}</td>" for x in r["kld_by_position"]) + "</tr>" for r in report["rows"][1:])
    images = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode((out / name).read_bytes()).decode()}"><figcaption>{name}</figcaption></figure>'
        for name in ("accuracy_vs_size.png", "kld_by_position.png", "state_vs_kld.png"))
    failed = "".join(f"<li>{escape(f['variant'])}: {escape(f['error'])}</li>" for f in report.get("failed", []))
    t = report["text"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edgettt report: {escape(report['model'])}</title>
<style>
{PAGE_STYLE}
.sw {{ display: inline-block; width: 10px; height: 10px; margin-right: 6px; border-radius: 2px; }}
figure {{ margin: 1.5em 0; }} img {{ max-width: 100%; }} figcaption {{ color: #666; font-size: 12px; }}
</style></head><body>
<h1>Accuracy against bits: {escape(report['model'])} ({escape(report['form'])} form)</h1>
<p>Text {escape(t['name'])} ({t['bytes']:,} bytes, sha256 {escape(t['sha256'])}), {report['windows']} windows of
{report['ctx']} tokens; the reference is the unquantized converted model. KLD: lower is better.</p>
<table id="variants"><thead><tr>{"".join(f"<th>{escape(h)}</th>" for h in head)}</tr></thead><tbody>{rows}</tbody></table>
{f"<h2>Failed variants</h2><ul>{failed}</ul>" if failed else ""}
<h2>Drift along the text (mean KLD by token position)</h2>
<table id="drift"><thead><tr><th>variant</th>{drift_head}</tr></thead><tbody>{drift}</tbody></table>
{images}
<p>Made by edgettt report.</p>
</body></html>
"""
