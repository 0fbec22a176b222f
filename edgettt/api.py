"""The Python API: one function per command, each returning an object (`import edgettt`).

    model = edgettt.load("ttt-linear-tiny")                       # a directory or a shipped model
    fast = edgettt.convert(model, form="exact")
    cal = edgettt.calibrate(fast, "python-docs:train", ctx=512, samples=4)
    q = edgettt.quantize(fast, edgettt.QuantConfig("int4", 64, "gptq", state="int8"), cal)
    result = edgettt.evaluate(q, "python-docs", ctx=512, ref=fast)     # .ppl, .bits_per_byte, .drift
    result = edgettt.report(model, "report/", weights=["int8", "int4-gptq-g64"], ctx=512)
    table = edgettt.compare(["ttt-linear-tiny-parallel", "lact-w1-tiny"], "compare/")  # .data, .table()
    exported = edgettt.export(parallel_model, "onnx/")                 # .path, .manifest, .runner()
    edgettt.save(q, "q4/")
    done = edgettt.convert_checkpoint("ttt-linear-tiny", "fast/", form="parallel")  # directories in and
    q8 = edgettt.quantize_checkpoint("fast/", "q8/", edgettt.QuantConfig("int8"))   # out, as the commands

Texts are given as the command line takes them: a path, "-", or a built-in name such as
"python-docs:train"; or as an `edgettt.data.Text`. Outputs are written as the commands write them
(never over an input, replaced only with force=True), and errors name the API's arguments.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from edgettt import benchmark, comparison, distributed, evaluation
from edgettt.calibration.mixed import Budget, MixedPlan, search_mix_on_calibration_text
from edgettt.checkpoint import load_model, save_model
from edgettt.conversion import convert as convert_model
from edgettt.distill import DistillSettings, distill_towards
from edgettt.resume import checkpoint_folder
from edgettt.data import Text, read_text
from edgettt.errors import EdgetttError
from edgettt.families.base import LanguageModel
from edgettt.onnx import ACTIVATIONS, default_activations, export_model
from edgettt.model_info import stored_size
from edgettt.outputs import Output, as_output
from edgettt.calibration import statistics as calibration
from edgettt.calibration.statistics import Calibration
from edgettt.quant.apply import quantize_model, skip_patterns, weight_bits
from edgettt.quant.config import QuantConfig
from edgettt.reporting import build_report, table, variants, write
from edgettt.runner import Runner, is_export
from edgettt.weights_io import saved_float_dtype
from edgettt.tokenizer import JsonTokenizer
from edgettt.web import copy_export
from edgettt.web import runtime_files as web_runtime_files


def _text(text) -> Text:
    return text if isinstance(text, Text) else read_text(text)


def calibrate(model: LanguageModel, text="python-docs:train", ctx: int = 2048, samples: int = 8, seed: int = 0,
              percentile: float = 99.99):
    """Statistics quantization needs from a converted model on sample text: the inputs of every linear
    layer (GPTQ Hessians) and the accumulated state's magnitudes, with int8 state scales. Returns a
    `Calibration` (`.save(path)`, `Calibration.load(path)`)."""
    return calibration.calibrate(model, _text(text), ctx, samples, seed, percentile)


def quantize(model: LanguageModel, config: QuantConfig | None = None, calibration=None, report=None) -> LanguageModel:
    """A quantized copy of a converted model (the model given is left as it is): weights, decode state
    and the record of both in its config, as `config` says (default: int8 weights, fp32 state).
    `calibration` (from `calibrate`) is needed for GPTQ and the int8 state. `report(row)` sees one
    dict per layer. Layers the format cannot take fall back as `config.fallback` says."""
    quantized = copy.deepcopy(model)
    quantize_model(quantized, config or QuantConfig(), calibration, report=report)
    return quantized


@dataclass
class Conversion:
    """What `convert_checkpoint` wrote: the converted model and its report (also OUT/convert_report.json; {}
    when nothing was measured), with the seconds the measurement took."""

    path: Path
    model: LanguageModel = field(repr=False)
    report: dict
    seconds: float = 0.0


def convert_checkpoint(src, out, form: str = "exact", decay: float | None = None, text="python-docs-sample",
                       ctx: int = 256, max_tokens: int = 4096, measure: bool = True,
                       distill: DistillSettings | None = None, train_text="python-docs:train", tokenizer=None,
                       force: bool = False) -> Conversion:
    """`edgettt convert`: the checkpoint `src` (a model directory, a shipped name, a ttt-lm-jax checkpoint) as a
    linear-attention model directory `out`, with its drift from `src` measured on `text` in windows of `ctx`
    (`measure`). `distill` (a `DistillSettings`) first tunes a parallel form towards `src` on `train_text`, the
    report then holding the drift before and after. `tokenizer`: a tokenizer.json to write with the model.
    Started by torchrun, the processes distil together (`edgettt.distributed`) and rank 0 measures and writes; with
    `distill.save_every`, checkpoints go to `out`.distill/, which `distill.resume` continues from."""
    out = as_output(out, "model", force, [src])
    measure_text = _text(text) if measure else None
    train = _text(train_text) if distill else None
    vocabulary = JsonTokenizer(Path(tokenizer)) if tokenizer else None
    # unmeasured and untuned, the model is never run: its tensors stay as stored and are re-labelled, not copied
    original = load_model(src) if measure or distill else load_model(src, dtype="stored")
    if vocabulary is not None:
        original.tokenizer = vocabulary.check_fits(original.config.vocab_size)
    # only a distillation changes the converted model's weights: else it may share the original's memory
    converted = convert_model(original, form, decay, copy=distill is not None)
    report, started = {}, time.perf_counter()
    if measure:
        report = evaluation.conversion_report(original, converted, measure_text, ctx, max_tokens)
    seconds = time.perf_counter() - started
    ranks = distributed.current()
    if distill:
        checkpoints = checkpoint_folder(out.path)
        record = distill_towards(original, converted, train, distill, ctx, source=str(src), ranks=ranks,
                                 checkpoints=checkpoints)
        if measure and ranks.main:
            record["before"] = report
            report = evaluation.conversion_report(original, converted, measure_text, ctx, max_tokens)
        report["distill"] = record
    if report:
        report["source"] = str(src)
    extra = {"convert_report.json": json.dumps(report, indent=2) + "\n"} if report else None
    if ranks.main:  # bfloat16 in, bfloat16 out (a distilled model keeps the float32 it was tuned in)
        save_model(converted, out, extra_files=extra, store=None if distill else saved_float_dtype(original))
        if distill:
            shutil.rmtree(checkpoints, ignore_errors=True)  # (the model is written: they served their purpose)
    return Conversion(out.path, converted, report, seconds)


@dataclass
class Quantized:
    """What `quantize_checkpoint` wrote: the model, the config it was quantized with (a mix's, for a budget), one
    row a layer, and the sizes before and after (MB and bits per weight as the directories store them)."""

    path: Path
    model: LanguageModel = field(repr=False)
    config: QuantConfig
    rows: list[dict] = field(repr=False)
    before: dict
    after: dict
    plan: MixedPlan | None = field(default=None, repr=False)


def quantize_checkpoint(src, out, config: QuantConfig | None = None, calibration=None, budget: Budget | None = None,
                        report=None, log=print, force: bool = False) -> Quantized:
    """`edgettt quantize`: the converted model directory `src` quantized as `config` says into `out`; with a
    `budget` (`Budget.parse("size=2.5")`), each layer's format chosen for it on the calibration's text (the
    search's lines to `log`). `calibration`: a `Calibration` or its file; `report(row)` sees one dict a layer."""
    calibration_file = calibration if isinstance(calibration, (str, Path)) else None
    out = as_output(out, "model", force, [src, calibration_file])
    config = config or QuantConfig()
    model = load_model(src)
    source = str(calibration_file or "calibration")
    cal = Calibration.load(calibration_file) if calibration_file else calibration
    before = weight_bits(model)
    plan = search_mix_on_calibration_text(model, cal, budget, config.state, source, log) if budget else None
    config = plan.config() if plan else config
    rows = quantize_model(model, config, cal, report=report, source=source, name=str(src))
    # float weights keep the file's precision (bfloat16 in, bfloat16 out); a quantized format's scales stay as made
    save_model(model, out, store=saved_float_dtype(model))
    after = weight_bits(model)
    return Quantized(out.path, model, config, rows, {**before, **stored_size(src, before["weights"])},
                     {**after, **stored_size(out.path, after["weights"])}, plan)


@dataclass
class Evaluation:
    """What `evaluate` measured: perplexity and bits per byte, and with a reference the drift."""

    report: dict
    logits: torch.Tensor = field(repr=False)
    windows: torch.Tensor = field(repr=False)

    @property
    def ppl(self) -> float:
        return self.report["ppl"]

    @property
    def bits_per_byte(self) -> float | None:
        return self.report.get("bits_per_byte")

    @property
    def drift(self) -> dict | None:
        """KL divergence statistics, top-1 agreement, RMS dp and KLD by position against the reference."""
        return self.report.get("drift")


def evaluate(model: LanguageModel, text="python-docs", ctx: int | list[int] = 512, max_tokens: int | None = 100_000,
             ref: LanguageModel | None = None, ref_logits=None, name: str = "model") -> Evaluation | list[Evaluation]:
    """Perplexity and bits per byte of `model` on `text` in windows of `ctx` tokens; against `ref` (a
    model) or `ref_logits` (a file saved by `edgettt eval --save-logits`), the drift. A list of window
    lengths gives a list of Evaluations, one a length (`edgettt eval --ctx 512,2048,8192`)."""
    if isinstance(ctx, (list, tuple)):
        return [evaluate(model, text, n, max_tokens, ref, ref_logits, name) for n in ctx]
    report, logits, windows = evaluation.evaluate(model, name, _text(text), ctx, max_tokens, ref,
                                                  "ref" if ref is not None else None, ref_logits)
    return Evaluation(report, logits, windows)


@dataclass
class Export:
    """An export directory: its manifest (graphs, states, verification) and a runner for it."""

    path: Path
    manifest: dict

    @property
    def verification(self) -> dict | None:
        return self.manifest.get("verification")

    def runner(self, threads: int | None = None):
        """The numpy + onnxruntime runner of this export (`edgettt.runner.Runner`)."""
        return Runner(self.path, threads)


def export(model, out, name: str = "model", verify_text="python-docs-sample", opset: int = 21,
           force: bool = False, activations: str | None = None, web: bool = False) -> Export:
    """prefill.onnx, decode.onnx, weights.bin and manifest.json for ONNX Runtime in `out`, checked in
    onnxruntime against torch on `verify_text` (None: not checked) before anything is written.
    `activations`: "int8" (quantized layers multiply int8 activations) or "float"; None: int8, or float with
    `web`. `web`: also a page that runs it in a browser (`edgettt.web`); `model` may then be an existing
    export's folder (copied)."""
    activations = activations or default_activations(web)
    if activations not in ACTIVATIONS:
        raise EdgetttError(f"activations {activations!r}: expected one of {', '.join(ACTIVATIONS)}")
    runtime = web_runtime_files() if web else None
    if web and isinstance(model, (str, Path)) and is_export(model):
        return Export(Path(out), copy_export(model, Output.plan(out, "export", force, [model], api=True), runtime))
    text = None if verify_text is None else _text(verify_text)
    manifest = export_model(model, out, name, opset=opset, force=force, verify_text=text, activations=activations,
                            web=runtime)
    return Export(Path(out), manifest)


@dataclass
class Report:
    """The accuracy-vs-bits report: one row per variant (`rows`), written to `path`."""

    path: Path
    data: dict

    @property
    def rows(self) -> list[dict]:
        return self.data["rows"]

    def table(self) -> str:
        return table(self.data)


def report(model: LanguageModel, out, text="python-docs", calib_text="python-docs:train",
           weights=("int8", "int8-gptq", "bnb-int8", "int4-rtn-g64", "int4-gptq-g64", "nf4-b64"),
           states=("int12", "int8", "int8-tensor", "fp16"), form: str = "exact", ctx: int = 2048,
           max_tokens: int = 100_000, skip=(), fallback: str = "int8", onnx: bool = False,
           force: bool = False, log=print, name: str | None = None) -> Report:
    """Convert (a TTT model, to `form`), calibrate on `calib_text`, quantize every variant and measure
    each against the float model on `text`; writes report.json/.csv/.md/.html and the plots to `out`.
    `weights` are variant names as `edgettt quantize --weights` takes them (int4-gptq-g64)."""
    planned = as_output(out, "report", force)
    data_text, calibration_text = _text(text), _text(calib_text)
    with planned.write() as tmp:
        data = build_report(model, name or getattr(model, "name", "model"), data_text, calibration_text,
                            variants(list(weights), list(states), skip_patterns(skip), fallback), ctx,
                            max_tokens, form, onnx=onnx, log=log)
        write(data, tmp)
    return Report(planned.path, data)


@dataclass
class Comparison:
    """Several models side by side (`comparison.compare`), written to `path`."""

    path: Path
    data: dict

    def table(self) -> str:
        return comparison.terminal(self.data)


def compare(models=comparison.DEFAULT_MODELS, out="edgettt-compare", text="python-docs:test",
            calib_text="python-docs:train", settings: comparison.CompareSettings | None = None, llama=None,
            gpu_bench=None, force: bool = False, log=print) -> Comparison:
    """Bits per byte at several lengths, weight and state drift, and CPU decode speed (int4 exports, beside the
    onnxruntime-genai Llama folder `llama` where given) of each of `models` (names, directories or models), the
    GPU rows of `gpu_bench` (an `edgettt bench --device cuda --json` file) where given; writes compare.json, .md,
    .html and the plots to `out`."""
    planned = as_output(out, "compare", force)
    loaded, sources = {}, {}
    for i, m in enumerate(models):
        if isinstance(m, (str, Path)):
            loaded[str(m)], sources[str(m)] = load_model(m), str(m)
        else:
            loaded[getattr(m, "name", f"model {i + 1}")] = m
    with planned.write() as tmp:
        data = comparison.compare(loaded, _text(text), _text(calib_text), settings or comparison.CompareSettings(),
                                  None if llama is None else Path(llama), None if gpu_bench is None else Path(gpu_bench),
                                  sources, log=log)
        comparison.write(data, tmp)
    return Comparison(planned.path, data)


def save(model: LanguageModel, out, force: bool = False, store: torch.dtype | None = None) -> None:
    """Write a model directory (config.json, weights, tokenizer) atomically; replaced only with force=True;
    `store=torch.bfloat16` keeps the floating matrices in half the bytes (`weights_io.stored_matrices`)."""
    save_model(model, out, force=force, store=store)


def bench(paths, pp=(512,), tg=(128,), depth=(0,), repetitions: int = 5, device: str = "cpu", batch: int = 1,
          threads: int | None = None, seed: int = 0) -> dict:
    """Tokens a second of exports or models (`paths`: directories, shipped names, on CUDA `llama:<preset>`),
    as `edgettt bench` measures them: ppN prefill and tgN@dD decode rows, median, min, max and ratio to the
    first path over `repetitions` in turns. Returns the JSON the command writes."""
    return benchmark.run([str(p) for p in paths], benchmark.tests(list(pp), list(tg), list(depth)), repetitions, threads,
                         seed, device, batch)
