"""The `edgettt` command line. Each command is a thin layer over the Python API.

Exit codes: 130 when interrupted (Ctrl-C; nothing half-written is left); 1 for bad input or a failed run (`EdgetttError`, or an operating-system error such as a
full disk: one line `Error: ...`, no traceback); 2 for a malformed command line (click's own: an
unknown option, a value out of the range `--help` shows). Every command plans its outputs before
any work (`outputs.Output.plan`): an output never touches an input, and `--force` replaces only what
edgettt wrote.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import click

from .errors import EdgetttError

RENAMED_COMMANDS = {"speed": "bench"}  # old name -> new: the old one still runs, with a note
MOVED_OPTIONS = {  # an option that left a command -> where its setting went (said beside click's error)
    "--steps": "--distill steps=N", "--lr": "--distill lr=X", "--batch": "--distill batch=N",
    "--minutes": "--distill minutes=M", "--distill-ctx": "--distill ctx=N/N", "--hard-weight": "--distill hard_weight=W",
    "--pool": "--distill pool=N", "-o": "the output is the command's last argument, OUT",
    "--output": "the output is the command's last argument, OUT", "--method": "the method is part of --weights' name "
    "(int4-gptq-g32)", "--keep-exports": "edgettt.report(..., ) in Python "
    "or `edgettt export` of the variant", "--group-size": "the group is part of --weights' name (int4-gptq-g32)",
    "--quantize-lm-head": "--lm-head same", "--top-k": "--sampling top-k=K", "--top-p": "--sampling top-p=P",
    "--seed": "run: --sampling seed=N"}


class Group(click.Group):
    def get_command(self, ctx, name):
        if name in RENAMED_COMMANDS:
            click.echo(f"note: `edgettt {name}` is now `edgettt {RENAMED_COMMANDS[name]}`", err=True)
            name = RENAMED_COMMANDS[name]
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # Ctrl-C: outputs are staged and renamed when complete, so none is half-written
            click.echo("\ninterrupted: nothing was written or replaced", err=True)
            ctx.exit(130)
        except click.NoSuchOption as exc:
            if exc.option_name in MOVED_OPTIONS:
                exc.message += f" ({exc.option_name} moved: {MOVED_OPTIONS[exc.option_name]})"
            raise
        except EdgetttError as exc:
            raise click.ClickException(str(exc)) from None
        except BrokenPipeError:  # `edgettt ... | head`: the reader left; nothing to say to it
            sys.stdout = open(os.devnull, "w")
            ctx.exit(1)
        except OSError as exc:  # a full disk, a file vanished under us: the run failed, say where
            where = f"{exc.filename}: " if exc.filename else ""
            raise click.ClickException(f"{where}{exc.strerror or exc}; the run stopped, nothing was replaced") \
                from None


class FiniteFloat(click.FloatRange):
    """A float range that also refuses nan and inf (click's FloatRange lets nan through)."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{rv} is not a finite number.", param, ctx)
        return rv


class WeightVariant(click.ParamType):
    """A weight variant's name, FORMAT[-METHOD][-gGROUP] (`quant.config.weight_variant`), read when used."""

    name = "VARIANT"

    def convert(self, value, param, ctx):
        from .quant.config import weight_variant

        try:
            weight_variant(value)
        except EdgetttError as exc:
            self.fail(str(exc).split(": ", 1)[1], param, ctx)
        return value


class RegistryChoice(click.Choice):
    """A click.Choice over names read from one of edgettt's registries when first needed: the
    registries import torch, and `edgettt run` (the ONNX runner) must start without it."""

    def __init__(self, names):
        self._names = names
        self.case_sensitive = True

    @property
    def choices(self):
        return tuple(self._names())


class StateFormatName(RegistryChoice):
    """A state format's name; an old one (`quant.state_formats.RENAMED`) is taken with a note."""

    def convert(self, value, param, ctx):
        try:
            return state_format_name(value)
        except EdgetttError as exc:
            self.fail(str(exc).split(": ", 1)[1], param, ctx)


def state_format_name(value: str) -> str:
    """Today's name of a state format a user gave (an old name with a note), or a one-line error."""
    from .quant.state_formats import RENAMED, STATE_FORMATS, renamed_note

    if value in RENAMED:
        click.echo(renamed_note(value), err=True)
        value = RENAMED[value]
    if value not in STATE_FORMATS:
        raise EdgetttError(f"--state: unknown state format {value!r}; use {', '.join(STATE_FORMATS)}")
    return value


def _names(module: str, registry: str, extra: tuple[str, ...] = ()):
    """The names of `edgettt.quant.<module>.<registry>` (a dict or a tuple) and `extra`, when asked."""
    def names():
        import importlib

        return [str(name) for name in getattr(importlib.import_module(f"edgettt.quant.{module}"), registry)] + list(extra)
    return names


POSITIVE = click.IntRange(min=1)
COUNT = click.IntRange(min=0)
SEED = click.IntRange(min=0, max=2**32 - 1)


def default_torch_threads(cores: int, load: float, torch_default: int) -> int:
    """torch's default (one per physical core) less the cores other work keeps busy (`load`, from
    `busy_cores`): threads that wait for a busy core cost more than they give (the README measures it)."""
    return max(1, min(torch_default, round(cores - load)))


def busy_cores(cores: int, interval: float = 0.05) -> float:
    """How many cores other work keeps busy now: the share of CPU time that was not idle over `interval`
    seconds (Linux's /proc/stat; this process sleeps meanwhile), times the cores. Elsewhere the 1-minute load
    average, which lags: right after another run ends it still counts that run."""
    try:
        first = idle_and_total(Path("/proc/stat").read_text())
        time.sleep(interval)
        second = idle_and_total(Path("/proc/stat").read_text())
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    idle, total = second[0] - first[0], second[1] - first[1]
    return cores * (1 - idle / total) if total > 0 else 0.0


def idle_and_total(proc_stat: str) -> tuple[int, int]:
    """(idle, total) CPU time of all cores from /proc/stat's first line (`cpu user nice system idle iowait irq
    softirq steal ...`): waiting for I/O counts as idle; guest time is already inside user time."""
    fields = [int(x) for x in proc_stat.splitlines()[0].split()[1:9]]
    return fields[3] + fields[4], sum(fields)


def torch_threads(command):
    """Add --threads to a command that runs torch, and set torch's CPU threads before it runs."""
    @click.option("--threads", type=click.IntRange(1, 1024), default=None,
                  help="torch CPU threads [default: the cores not busy with other work, measured when the command starts].")
    @functools.wraps(command)
    def run_with_threads(*args, threads=None, **kwargs):
        import torch

        if threads is None:
            cores = os.cpu_count() or 1
            threads = default_torch_threads(cores, busy_cores(cores), torch.get_num_threads())
        torch.set_num_threads(threads)
        return command(*args, **kwargs)
    return run_with_threads


# `create --set`: the config.json keys it takes, with its defaults (a small byte-level model)
CREATE_DEFAULTS = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": None,
                   "vocab_size": 256, "mini_batch_size": 16, "share_qk": False, "pre_conv": False, "use_gate": False,
                   "tie_word_embeddings": True}


def config_settings(pairs: tuple[str, ...]) -> dict:
    """`--set KEY=VALUE` pairs as config values: positive integers, or true/false for the switches."""
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in CREATE_DEFAULTS:
            raise click.BadParameter(f"{pair!r}: unknown key {key!r}; use one of {', '.join(CREATE_DEFAULTS)}",
                                     param_hint="--set")
        if isinstance(CREATE_DEFAULTS[key], bool):
            if value.lower() not in ("true", "false"):
                raise click.BadParameter(f"{pair!r}: {key} is true or false", param_hint="--set")
            out[key] = value.lower() == "true"
        elif not value.isdigit() or int(value) < 1:
            raise click.BadParameter(f"{pair!r}: {key} is a positive integer", param_hint="--set")
        else:
            out[key] = int(value)
    return out


def model_input(spec):
    """The directory a MODEL argument names (a path, or a shipped model's folder): an input to protect."""
    from .checkpoint import resolve_model_path

    return None if spec is None else resolve_model_path(spec)


def text_input(spec):
    """The file or folder a TEXT option names, or None for stdin and built-in texts."""
    from .data import text_path

    return text_path(spec)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgettt")
@click.option("--no-progress", is_flag=True, help="No progress bars (they are off anyway when stderr is not a terminal, "
              "unless the environment sets EDGETTT_PROGRESS=always: then they are written as lines, for logs).")
def cli(no_progress):
    """Take TTT-KV language models (TTT-Linear, TTT-MLP, LaCT) to the edge as linear attention.

    \b
    edgettt create OUT            a random TTT checkpoint, to try the pipeline
    edgettt convert SRC OUT       TTT checkpoint -> linear-attention model (+ drift report)
    edgettt eval MODEL            perplexity, bits per byte, drift against a reference
    edgettt calibrate MODEL OUT   statistics for quantization (layer inputs, the state)
    edgettt quantize MODEL OUT    4/8-bit weights, int12/int8/fp16 state
    edgettt report [MODEL] [OUT]  the whole chain: the accuracy-vs-bits table
    edgettt export MODEL OUT      prefill.onnx + decode.onnx + manifest.json, verified in onnxruntime
    edgettt run EXPORT --prompt P generate with onnxruntime and numpy only (no torch)
    edgettt info MODEL            family, form, sizes, parameters, decode-state bytes
    edgettt bench PATH...         tokens/s (prefill, decode at depth) of exports or models, llama-bench style

    MODEL is a model directory or the name of a shipped model: ttt-linear-tiny, ttt-mlp-tiny,
    ttt-linear-tiny-parallel, ttt-mlp-tiny-parallel (the distilled parallel forms), lact-tiny,
    lact-w1-tiny (LaCT, SwiGLU and linear fast weights). Data (TEXT) defaults differ by purpose:
    python-docs:train to calibrate and distil on, python-docs (its held-out test part) to measure.

    Exit codes: 0 done; 1 bad input or a failed run (one line on stderr); 2 a malformed command line;
    130 interrupted (Ctrl-C: nothing half-written is left behind).
    """
    if no_progress:
        os.environ["TQDM_DISABLE"] = "1"  # progress.bar reads it for every bar


@cli.command()
@torch_threads
@click.argument("out", type=click.Path())
@click.option("--family", type=click.Choice(["linear", "mlp"]), default="linear", show_default=True,
              help="TTT-Linear or TTT-MLP.")
@click.option("--preset", type=click.Choice(["125m", "350m", "760m", "1b"]), default=None,
              help="A published ttt-lm-pytorch size (hidden, layers, heads, intermediate; vocabulary 32000, the "
                   "Llama tokenizer's size): 125m 768/12/12/2048, 350m 1024/24/16/2736, 760m 1536/24/16/4096, "
                   "1b 2048/24/32/5504. Random weights: for speed and size, not for text.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", callback=lambda c, p, v: config_settings(v),
              help="A config.json key (repeatable), shown at its default: " + ", ".join(
                  f"{k}={str(v).lower() if v is not None else '2.75 x hidden_size'}" for k, v in CREATE_DEFAULTS.items())
                   + " (vocab_size 256: byte-level).")
@click.option("--tokenizer", "tokenizer_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="A tokenizer.json to write with the model; without --preset or --set vocab_size, the "
                   "vocabulary is its size [default: byte-level, ids 0-255].")
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--weights-format", type=click.Choice(["safetensors", "bin"]), default="safetensors",
              show_default=True)
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
def create(out, family, preset, settings, tokenizer_file, seed, weights_format, force):
    """Write a randomly initialised TTT checkpoint in the ttt-lm-pytorch layout to OUT: a small one
    (--set to size it), or a published size (--preset)."""
    from .checkpoint import save_model
    from .config import PRESET_VOCAB, PRESETS, ModelConfig
    from .outputs import Output
    from .random_init import random_model
    from .tokenizer import JsonTokenizer

    sizes = {**CREATE_DEFAULTS, **settings}
    tokenizer = JsonTokenizer(Path(tokenizer_file)) if tokenizer_file else None
    if tokenizer is not None and "vocab_size" not in settings:
        sizes["vocab_size"] = tokenizer.vocab_size
    if preset:
        given = sorted(set(settings) & {*PRESETS[preset], "vocab_size"})
        if given:
            raise EdgetttError(f"--preset {preset} sets {', '.join(given)}; leave them out of --set, or drop --preset")
        sizes.update(PRESETS[preset], vocab_size=PRESET_VOCAB)
    if sizes["intermediate_size"] is None:
        sizes["intermediate_size"] = int(2.75 * sizes["hidden_size"])
    out = Output.plan(out, "model", force, inputs=[tokenizer_file and Path(tokenizer_file)])
    config = ModelConfig(**sizes, ttt_layer_type=family)
    config.validate("--options")
    config.check_memory("--options")
    if tokenizer is not None:
        tokenizer.check_fits(config.vocab_size)
    elif config.vocab_size > 256:
        click.echo(f"note: a vocabulary of {config.vocab_size:,} with the byte-level tokenizer: text uses ids 0-255 "
                   "only, and generated ids from 256 on decode to nothing; give the model's --tokenizer", err=True)
    model = random_model(config, seed)
    model.tokenizer = tokenizer or model.tokenizer
    save_model(model, out, weights_format=weights_format)
    click.echo(f"wrote {out.path}: random {config.family}, {model.num_parameters():,} parameters"
               + (f" (preset {preset}: random weights, for speed and size)" if preset else ""))


@cli.command()
@torch_threads
@click.argument("src", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--form", type=click.Choice(["exact", "parallel"]), default="exact", show_default=True,
              help="exact: equals the original; parallel: fully parallel, values at the initial state.")
@click.option("--decay", default=None, type=FiniteFloat(min=0, max=1, min_open=True, max_open=True), metavar="GAMMA",
              help="With --form parallel: a decayed parallel form, each head's state decaying towards its initial "
                   "state by GAMMA a mini-batch (e.g. 0.97; --distill tunes each head's): its state stops growing "
                   "with the text, so one model can hold from short to long contexts (DESIGN section 4).")
@click.option("--data", default=None, metavar="TEXT",
              help="Text to measure on (with --distill: to train on): a file, a directory of .txt/.md, "
                   "'-' for stdin, or a built-in name (python-docs[:train|:val|:test], python-docs-sample, "
                   "python-stdlib) [default: python-docs-sample; with --distill: python-docs:train].")
@click.option("--eval-data", default=None, metavar="TEXT",
              help="With --distill: text the report measures on [default: python-docs-sample].")
@click.option("--ctx", default=256, show_default=True, type=POSITIVE, help="Tokens per measured (and distillation) window.")
@click.option("--max-tokens", default=4096, show_default=True, type=POSITIVE, help="Measure at most this many tokens.")
@click.option("--distill", "distill_spec", is_flag=False, flag_value="", default=None, metavar="[SETTINGS]",
              help="Tune the converted model towards the original on --data. SETTINGS (optional): comma-separated "
                   "KEY=VALUE of steps (300), lr (1e-3), batch (32 windows a step), ctx (window lengths trained at "
                   "in turn, e.g. 512/2048 [--ctx]), minutes (also stop after), hard_weight (share of the plain "
                   "next-token loss, 0), pool (the original's logits of this many batches a length reused, 0: "
                   "for a slow original); e.g. --distill steps=3000,lr=3e-4,ctx=512/2048.")
@click.option("--tokenizer", "tokenizer_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="A tokenizer.json to measure with and write with the model (a ttt-lm-jax checkpoint carries "
                   "none; the public ones use Llama 2's) [default: SRC's].")
@click.option("--no-report", is_flag=True, help="Convert without measuring.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
def convert(src, out, form, decay, data, eval_data, ctx, max_tokens, distill_spec, tokenizer_file, no_report, as_json,
            force):
    """Convert the TTT checkpoint SRC (a directory, a shipped model's name, or a ttt-lm-jax checkpoint:
    its streaming_params or streaming_train_state file, or the folder holding it) into a
    linear-attention model in OUT.

    The report (printed, and saved as OUT/convert_report.json) gives, for the exact form, the
    error of logits against SRC; for the parallel form, the drift: perplexity of both, KL
    divergence and top-1 agreement. With --distill, the drift before and after distillation.
    """
    from . import convert as convert_model
    from . import load
    from .checkpoint import save_model
    from .data import read_text
    from .evaluation import conversion_report, encode
    from .outputs import Output
    from .tokenizer import JsonTokenizer
    from .weights_io import saved_float_dtype

    if decay is not None and form != "parallel":
        raise EdgetttError(f"--decay is for --form parallel (a decayed parallel form), not --form {form}")
    distill = distill_spec is not None
    settings = distill_settings(distill_spec) if distill else None
    out = Output.plan(out, "model", force, inputs=[model_input(src), text_input(data), text_input(eval_data),
                                                    tokenizer_file and Path(tokenizer_file)])
    check_convertible(src, form, distill or decay is not None)
    measure_text = read_text(eval_data if distill else data)  # texts first: a bad one fails before any work
    train_text = read_text(data or "python-docs:train") if distill else None
    tokenizer = JsonTokenizer(Path(tokenizer_file)) if tokenizer_file else None
    measured = not no_report or distill
    # unmeasured, the model is never run: its tensors stay as stored and are re-labelled, not copied
    original = load(src) if measured else load(src, dtype="stored")
    if tokenizer is not None:
        original.tokenizer = tokenizer.check_fits(original.config.vocab_size)
    # only a distillation changes the converted model's weights: else it may share the original's memory
    converted = convert_model(original, form, decay, copy=distill)
    report = {}
    if not no_report:
        started = time.perf_counter()
        report = conversion_report(original, converted, measure_text, ctx, max_tokens)
        if not distill and (note := drift_note(report, time.perf_counter() - started)):
            click.echo(note, err=True)
    if distill:
        from .distill import distill as run_distill

        lengths = list(settings.ctx) or [ctx]
        losses = run_distill(original, converted, encode(original, train_text, str(src)), steps=settings.steps,
                             lr=settings.lr, ctx=lengths, batch=settings.batch, hard_weight=settings.hard_weight,
                             minutes=settings.minutes, pool=settings.pool)
        # the longest context it was tuned at (config.json: kept by quantize, export)
        converted.config.extra["distilled_ctx"] = max(lengths)
        distilled = {"train_text": train_text.fingerprint(), "steps_asked": settings.steps,
                     "minutes": settings.minutes, "steps": len(losses),  # fewer than asked when minutes ended it
                     "lr": settings.lr, "ctx": lengths if len(lengths) > 1 else lengths[0], "batch": settings.batch,
                     "hard_weight": settings.hard_weight, "pool": settings.pool,
                     "loss_first": losses[0], "loss_last": losses[-1]}
        if not no_report:
            distilled["before"] = report
            report = conversion_report(original, converted, measure_text, ctx, max_tokens)
        report["distill"] = distilled
    if report:
        report["source"] = str(src)
    extra = {"convert_report.json": json.dumps(report, indent=2) + "\n"} if report else None
    # bfloat16 in, bfloat16 out (a distilled model's trained weights keep the float32 they were tuned in)
    store = None if distill else saved_float_dtype(original)
    save_model(converted, out, extra_files=extra, store=store)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"wrote {out.path}: {converted.config.family}, form {form}"
               + (f", decayed (gamma {decay} a mini-batch to start)" if decay is not None else ""))
    if "distill" in report and "before" in report["distill"]:
        distilled = report["distill"]
        click.echo("before distillation:\n" + format_conversion_report(distilled["before"]))
        loss_name = "loss" if distilled.get("hard_weight") else "KL loss"
        click.echo(f"after {distilled['steps']} distillation steps ({loss_name} {distilled['loss_first']:.4f} -> "
                   f"{distilled['loss_last']:.4f}):")
    if "form" in report:
        click.echo(format_conversion_report(report))


def check_convertible(src, form: str, tunes: bool) -> None:
    """Before any work: SRC is a float model, and converting it changes something (a model already in the form
    asked for is only re-labelled, unless --distill or --decay tunes it)."""
    from .checkpoint import stored_config

    config = stored_config(src)
    if config is None:
        return
    if config.quantization:
        raise EdgetttError(f"{src}: a quantized model; convert the float model, then quantize the converted one")
    asked = "lact" if config.family == "lact" and form == "exact" else form  # LaCT's exact form is its own
    if config.form == asked and not tunes:
        raise EdgetttError(f"{src}: already the {form} form, so converting it changes nothing; convert the original "
                           "checkpoint, or add --distill to tune this one further")


def check_exportable_form(model_path) -> None:
    """Before any work: a converted model given to `report --onnx` must be the parallel form."""
    from .checkpoint import stored_config

    form = getattr(stored_config(model_path), "form", "ttt")  # (an original checkpoint: converted to it)
    if form not in ("ttt", "parallel"):
        raise EdgetttError(f"{model_path}: --onnx exports the parallel form, this model is the {form} form; give "
                           "the original checkpoint or a parallel-form model")


def check_unquantized(model_path, command: str, states=()) -> None:
    """Before any work: `command` (quantize, calibrate, report) starts from a model that is not quantized yet, and
    each state format in `states` applies to its family (from config.json, no weights read)."""
    from .checkpoint import family_classes, model_type, resolve_model_path, stored_config

    config = stored_config(model_path)
    if config is None:
        return
    if command == "quantize" and config.form == "ttt":
        raise EdgetttError(f"{model_path}: an original TTT model; quantize a converted one (`edgettt convert "
                           f"{model_path} OUT --form parallel`)")
    if config.quantization:
        q = config.quantization
        raise EdgetttError(f"{model_path}: already quantized ({q.get('target') or q.get('variant')} weights, "
                           f"{q.get('state')} state); {command} the float model it was quantized from")
    model_class = family_classes(model_type(resolve_model_path(model_path) / "config.json"))[2]
    for name in states:
        refusal = model_class.state_format_refusal(name)
        if refusal:
            raise EdgetttError(f"{model_path}: {refusal}")


LARGE_DRIFT = 1.10  # a parallel form's perplexity this far above the original's gets a note


def drift_note(report: dict, seconds: float) -> str | None:
    """One line for a parallel form that drifts far: by how much, and what --distill would take here,
    estimated from the report's own speed (its forwards of both models over its tokens; a distillation
    step is a forward of each and the student's backward, about four forwards, on a batch of windows)."""
    ratio = report.get("ppl_ratio")
    if report.get("form") != "parallel" or ratio is None or ratio < LARGE_DRIFT:
        return None
    from .distill import DistillSettings

    settings = DistillSettings()
    per_token = seconds / (2 * report["windows"] * report["ctx"])
    minutes = settings.steps * settings.batch * report["ctx"] * 4 * per_token / 60
    return (f"note: the parallel form's perplexity is {100 * (ratio - 1):.0f}% above the original's: tune it "
            f"towards the original with --distill ({settings.steps} steps at --ctx {report['ctx']}, an estimated "
            f"{minutes:.0f} min on this machine from this run's speed), or keep --form exact, which does not drift")


def distill_settings(spec: str):
    """`--distill`'s SETTINGS as a `DistillSettings`, or a one-line error naming the option."""
    from .distill import DistillSettings

    try:
        return DistillSettings.parse(spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--distill'") from None


def format_conversion_report(r: dict) -> str:
    text = r["text"]
    lines = [f"measured on {text['name']} ({text['bytes']} bytes, sha256 {text['sha256']}), "
             f"{r['windows']} x {r['ctx']} tokens",
             f"  logits vs {r['source_form']}: max abs error {r['max_abs_error']:.3e}, "
             f"relative error {r['rel_error']:.3e}"]
    if r["form"] == "parallel":
        bpb = ""
        if "bits_per_byte" in r["ref"]:
            bpb = f"   bits/byte {r['ref']['bits_per_byte']:.4f} -> {r['model']['bits_per_byte']:.4f}"
        lines += [
            f"  perplexity  {r['ref']['ppl']:.4f} -> {r['model']['ppl']:.4f}  "
            f"({100 * (r['ppl_ratio'] - 1):+.2f}%){bpb}",
            f"  KLD         mean {r['kld_mean']:.5f} +/- {r['kld_stderr']:.5f}   median {r['kld_median']:.5f}   "
            f"p99 {r['kld_p99']:.5f}   max {r['kld_max']:.5f}",
            f"  top-1 agreement {100 * r['top1']:.2f}%   RMS dp {100 * r['rms_dp']:.3f}%",
        ]
    return "\n".join(lines)


def mixed_config(model, cal, calib, budget, state: str):
    """`quantize --target`: the mix of layer formats for `budget`, searched on the calibration's own text; its
    frontier and choice printed."""
    from .data import read_text
    from .quant.mixed import search_mix

    text = read_text(cal.text["name"]) if cal.text["name"] != "stdin" else None
    if text is None or text.fingerprint()["sha256"] != cal.text["sha256"]:
        raise EdgetttError(f"{calib}: its text {cal.text['name']} cannot be read as it was (sha256 "
                           f"{cal.text['sha256']}); --target measures on the calibration's text, calibrate again")
    plan = search_mix(model, cal, text, budget, state=state, log=click.echo)
    for row in plan.uniform:
        click.echo(f"  every layer {row['variant']:16s} {row['size_mb']:8.3f} MB  "
                   f"predicted KLD {row['predicted_kld']:.5f}")
    click.echo(f"  mix for {budget}: {plan.size_mb:.3f} MB, predicted KLD {plan.predicted_kld:.5f}, measured "
               f"{plan.measured_kld:.5f} on {plan.tokens} tokens of {text.name}")
    return plan.config()


def stored_size(model_path, weights: int) -> dict:
    """`size_mb` and `bits_per_weight` of `weights` as a model directory's files store them (a bfloat16 file:
    half the float32 it computes in); empty where no model directory's headers say (a ttt-lm-jax file, a
    tensor type edgettt does not know). What info, quantize and eval give as a model's size."""
    from .checkpoint import model_directory
    from .weights_io import stored_bytes

    directory = model_directory(model_path)
    n_bytes = stored_bytes(directory) if directory is not None else None
    if n_bytes is None or not weights:
        return {}
    return {"size_mb": n_bytes / 1e6, "bits_per_weight": 8 * n_bytes / weights}


@cli.command()
@torch_threads
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.argument("output", metavar="OUT", type=click.Path())
@click.option("--data", default="python-docs:train", show_default=True, metavar="TEXT",
              help="Sample text (see `edgettt eval --help` for the forms TEXT takes).")
@click.option("--seq-len", default=2048, show_default=True, type=POSITIVE,
              help="Tokens per sample: the context to calibrate for.")
@click.option("--samples", default=8, show_default=True, type=POSITIVE, help="Number of windows drawn from the text.")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Which windows are drawn.")
@click.option("--percentile", default=99.99, show_default=True, type=FiniteFloat(0, 100, min_open=True),
              help="Clipping percentile of the state scales.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
def calibrate(model_path, data, seq_len, samples, seed, percentile, output, force):
    """Record in the file OUT what quantization needs from a converted MODEL (or a LaCT model) on sample text: the input
    statistics of every linear layer (GPTQ Hessians) and the accumulated state's per-row magnitudes
    along the positions (LaCT: how far the fast weights kept between chunks move from their initial
    values), with the chosen int8 state scales."""
    from . import load
    from .data import read_text
    from .outputs import Output
    from .quant.calibration import calibrate as run_calibration

    out = Output.plan(output, "calibration", force, inputs=[model_input(model_path), text_input(data)])
    check_unquantized(model_path, "calibrate")
    text = read_text(data)
    model = load(model_path)
    cal = run_calibration(model, text, seq_len, samples, seed, percentile)
    cal.save(out)
    click.echo(f"wrote {output}: {len(cal.hessians)} layer input statistics, state scales for "
               f"{len(cal.state_scales)} layer levels; {cal.samples} x {cal.seq_len} tokens of {cal.text['name']} "
               f"(sha256 {cal.text['sha256']}), model {cal.model_fingerprint}")
    for key in sorted(cal.state_rowmax, key=lambda k: [int(p) if p.isdigit() else p for p in k.split(".")]):
        curve = cal.state_rowmax[key].amax((0, 1))
        click.echo(f"  layer {key:8s} max |row| by position bucket: " + " ".join(f"{v:8.3g}" for v in curve.tolist()))


@cli.command()
@torch_threads
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--weights", default="int8", show_default=True, type=WeightVariant(),
              help="FORMAT[-METHOD][-gGROUP]: int8, int8-gptq, int4-rtn-g64, int4-gptq-g32 (gptq: error feedback, "
                   "needs --calib; g: the group along the input), int6-gptq-g128 (64 levels a group: between int4 "
                   "and int8), nf4-b64, fp4-b64 (bitsandbytes' codebooks, blocks of 64), bnb-int8 (LLM.int8), "
                   "float. Left out: rtn, 64 (int4 is int4-rtn-g64).")
@click.option("--state", type=StateFormatName(_names("state_formats", "STATE_FORMATS")), default="fp32",
              show_default=True,
              help="How the decode state S is kept. fp16; int12: 12 bits a value in two codes (1.5 bytes), a step "
                   "per row recomputed at every commit, the open mini-batch's keys and values in float16 in place "
                   "of A (32% of the float state's bytes for ttt-linear-tiny); int12-kv8: the same with those keys "
                   "(rotated) and values in int8 (26%); int8: 8 bits, calibrated per-row "
                   "scales (needs --calib); int8-tensor: 8 bits, one scale from the initial state.")
@click.option("--calib", type=click.Path(), default=None, help="Calibration file from `edgettt calibrate`.")
@click.option("--skip", multiple=True, metavar="PATTERN",
              help="Also leave layers whose name matches PATTERN in float (repeatable).")
@click.option("--lm-head", "head", type=RegistryChoice(_names("config", "HEAD_FORMATS")), default=None,
              help="lm_head's format (a tied embedding reads its rows): float, int8, or same as --weights "
                   "[default: int8 beside 4-bit --weights (int4, nf4, fp4), else float].")
@click.option("--fallback", type=RegistryChoice(_names("config", "FALLBACKS")), default="int8", show_default=True,
              help="Format of a layer --weights cannot take (int4/nf4/fp4 when its input size is not a multiple of "
                   "the group); refuse: stop before any work and list those layers.")
@click.option("--target", default=None, metavar="size=MB|kld=X",
              help="Mixed precision: choose each layer's format (int4 in groups of 32/64/128 or int8, by GPTQ, or "
                   "float; lm_head too) for the least drift within a size of weights, or the fewest bytes within a "
                   "mean KLD, measured layer by layer on the calibration's text. Needs --calib; in place of "
                   "--weights and --lm-head.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@click.pass_context
def quantize(ctx, model_path, out, weights, state, calib, skip, head, fallback, target, force):
    """Quantize the weights (and the decode state) of a converted MODEL into OUT."""
    from . import load
    from .checkpoint import save_model
    from .outputs import Output
    from .quant.apply import quantize_model, skip_patterns, weight_bits
    from .quant.calibration import Calibration
    from .quant.config import QuantConfig, default_head_format, weight_variant
    from .quant.mixed import Budget
    from .weights_io import saved_float_dtype

    budget = Budget.parse(target) if target is not None else None
    if budget and (ctx.get_parameter_source("weights").name != "DEFAULT" or head):
        raise EdgetttError("--target chooses every layer's format, lm_head's too; drop --weights and --lm-head")
    if budget and skip:
        raise EdgetttError("--target chooses every layer's format; drop --skip (a layer it keeps in float is a choice)")
    if budget and not calib:
        raise EdgetttError(f"--target {budget} measures each layer with GPTQ's statistics: run `edgettt calibrate` "
                           "and pass --calib")
    fmt, chosen_method, group = weight_variant(weights)
    head = head or default_head_format(fmt)
    if head == "int8" and fmt == "none":
        raise EdgetttError("--lm-head int8 quantizes lm_head beside quantized weights; give --weights too, or "
                           "--lm-head float")
    out = Output.plan(out, "model", force, inputs=[model_input(model_path), calib])
    config = QuantConfig(weights=fmt, group_size=group, method=chosen_method, state=state,
                         skip=skip_patterns(skip, quantize_lm_head=head != "float"), fallback=fallback,
                         overrides={"lm_head": head} if head not in ("float", "same", fmt) else {})
    if config.needs_calibration() and not calib:
        raise EdgetttError(f"--weights {config.variant} --state {state} needs a calibration: run `edgettt calibrate` "
                           "and pass --calib")
    check_unquantized(model_path, "quantize", [state])
    model = load(model_path)
    cal = Calibration.load(calib) if calib else None
    before = weight_bits(model)
    if budget:
        config = mixed_config(model, cal, calib, budget, state)

    def line(row):
        click.echo(f"  {row['name']:45s} {'x'.join(map(str, row['shape'])):>9s}  {row['format']:14s} "
                   f"{row['bytes_before'] / 1e3:9.1f} kB -> {row['bytes_after'] / 1e3:8.1f} kB"
                   + ("  (fallback)" if row.get("fallback") else ""))

    rows = quantize_model(model, config, cal, report=line, source=str(calib), name=str(model_path))
    misfits = sum(row["fallback"] for row in rows)
    if misfits:
        click.echo(f"{misfits} layers cannot be {config.variant} (input size not a multiple of {group}): "
                   f"kept in {fallback} (--fallback)", err=True)
    # float weights keep the file's precision (bfloat16 in, bfloat16 out); a quantized format's scales stay as made
    save_model(model, out, store=saved_float_dtype(model))
    after = weight_bits(model)
    before, after = {**before, **stored_size(model_path, before["weights"])}, \
        {**after, **stored_size(out.path, after["weights"])}
    click.echo(f"wrote {out.path}: {before['size_mb']:.2f} MB -> {after['size_mb']:.2f} MB, "
               f"{after['bits_per_weight']:.2f} bits per weight ({config.variant}); state {state}")


@cli.command()
@torch_threads
@click.argument("model_path", metavar="[MODEL]", required=False, default="ttt-linear-tiny", type=click.Path())
@click.argument("output", metavar="[OUT]", required=False, default="edgettt-report", type=click.Path())
@click.option("--data", default="python-docs", show_default=True, metavar="TEXT", help="Text to evaluate on.")
@click.option("--calib-data", default="python-docs:train", show_default=True, metavar="TEXT", help="Text to calibrate on.")
@click.option("--weights", "weights_list", default="int8,int8-gptq,bnb-int8,int4-rtn-g64,int4-gptq-g64,nf4-b64",
              show_default=True, help="Comma-separated weight variants, spelt as `edgettt quantize --weights` takes "
                                      "them (int4-gptq-g32, fp4-b128, ...), or mix:size=MB / mix:kld=X for the mix "
                                      "`quantize --target` chooses (its predicted frontier drawn in the size plot).")
@click.option("--state", "state_list", default="int12,int8,int8-tensor,fp16", show_default=True,
              help="Comma-separated state variants (each with float weights).")
@click.option("--form", type=click.Choice(["exact", "parallel"]), default=None,
              help="Form to convert a TTT checkpoint to [default: exact; with --onnx parallel, the form an export "
                   "takes].")
@click.option("--ctx", default=2048, show_default=True, type=POSITIVE,
              help="Tokens per evaluation window; also the calibration's sequence length.")
@click.option("--max-tokens", default=100_000, show_default=True, type=POSITIVE,
              help="Evaluate on at most this many tokens of --data.")
@click.option("--skip", multiple=True, metavar="PATTERN",
              help="Also leave layers matching PATTERN in float in every variant (added to lm_head; repeatable).")
@click.option("--fallback", type=RegistryChoice(_names("config", "FALLBACKS")), default="int8", show_default=True,
              help="Format of a layer a variant's format cannot take; refuse: stop before any work.")
@click.option("--onnx", is_flag=True, help="Also export every variant (parallel form) and measure decode.onnx's size "
                                           "and onnxruntime CPU tokens/s, prefill and decode, batch 1.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
def report(model_path, output, data, calib_data, weights_list, state_list, form, ctx, max_tokens, skip, fallback,
           onnx, force):
    """Convert, calibrate, quantize every variant and measure each against the float model: the
    accuracy-vs-bits table (printed; report.json/.csv/.md/.html and PNG plots in the directory OUT,
    edgettt-report unless given). With no MODEL, runs on the shipped ttt-linear-tiny."""
    from . import load
    from .data import read_text
    from .outputs import Output
    from .reporting import build_report, table, variants, weight_variant_or_mix, write

    names = [w.strip() for w in weights_list.split(",") if w.strip()]
    for w in names:
        weight_variant_or_mix(w)
    states = [state_format_name(s.strip()) for s in state_list.split(",") if s.strip()]
    if onnx and form == "exact":
        raise EdgetttError("--onnx exports the parallel form, not --form exact; drop --form exact (--onnx picks the "
                           "parallel form)")
    form = form or ("parallel" if onnx else "exact")
    out = Output.plan(output, "report", force,
                      inputs=[model_input(model_path), text_input(data), text_input(calib_data)])
    if onnx and model_path is not None:
        check_exportable_form(model_path)
    check_unquantized(model_path, "report on", states)
    text, calib_text = read_text(data), read_text(calib_data)
    model = load(model_path)
    warn_beyond_distillation(model_path, model.config.extra.get("distilled_ctx"), ctx)
    with out.write() as tmp:
        from .quant.apply import skip_patterns

        result = build_report(model, str(model_path), text, calib_text,
                              variants(names, states, skip_patterns(skip), fallback), ctx, max_tokens, form,
                              onnx=onnx, log=click.echo)
        write(result, tmp)
    click.echo(table(result))
    click.echo(f"wrote {output}/report.json, report.csv, report.md, report.html, accuracy_vs_size.png, "
               "kld_by_position.png, state_vs_kld.png")
    if result["failed"]:
        failures = "; ".join(f"{f['variant']}: {f['error']}" for f in result["failed"])
        raise EdgetttError(f"{len(result['failed'])} variants failed ({failures}); the report in {output} holds the "
                           "others")


@cli.command("eval")
@torch_threads
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--ref", "ref_path", default=None, metavar="MODEL", help="Reference model to measure drift against.")
@click.option("--ref-logits", default=None, type=click.Path(), help="Saved reference logits (--save-logits).")
@click.option("--data", default="python-docs", show_default=True, metavar="TEXT",
              help="A file, a directory of .txt/.md, '-' for stdin, or a built-in name "
                   "(python-docs[:train|:val|:test], python-docs-sample, python-stdlib).")
@click.option("--ctx", default="512", show_default=True, callback=lambda c, p, v: int_list(c, p, v),
              help="Tokens per window; a comma-separated list (e.g. 512,2048,8192) measures at each length, one "
                   "row per context.")
@click.option("--max-tokens", default=100_000, show_default=True, type=POSITIVE, help="Evaluate at most this many tokens.")
@click.option("--save-logits", default=None, type=click.Path(),
              help="Save MODEL's logits as reference logits for later runs.")
@click.option("--json", "json_path", default=None, type=click.Path(), help="Write the report as JSON.")
@click.option("--force", is_flag=True, help="Overwrite existing --save-logits / --json files.")
def evaluate_cmd(model_path, ref_path, ref_logits, data, ctx, max_tokens, save_logits, json_path, force):
    """Perplexity and bits per byte of MODEL on TEXT; with --ref or --ref-logits, the drift against
    the reference (KL divergence statistics, top-1 agreement, RMS dp, KLD by position). With several
    --ctx lengths, one row per context (the whole text in windows of each length; JSON: "contexts").

    MODEL may be an export (`edgettt export`'s folder): its prefill graph runs in ONNX Runtime, so the
    numbers are the deployed files' own; e.g. `edgettt eval EXPORT --ref MODEL`."""
    from . import load
    from .data import read_text
    from .evaluation import ExportLogits, evaluate, save_reference
    from .outputs import plan_outputs
    from .runner import is_export

    if ref_path and ref_logits:
        raise EdgetttError("--ref and --ref-logits: give one reference, not both")
    if not ctx:
        raise EdgetttError("--ctx: give at least one window length, e.g. 512 or 512,2048,8192")
    if len(ctx) > 1 and (save_logits or ref_logits):
        raise EdgetttError("--save-logits / --ref-logits hold the logits of one window length: give one --ctx with them")
    logits_out, json_out = plan_outputs(
        (save_logits, "logits", force, "--save-logits"), (json_path, "json", force, "--json"),
        inputs=[model_input(model_path), model_input(ref_path), ref_logits, text_input(data)])
    text = read_text(data)
    export = is_export(model_path)
    model = ExportLogits(model_path) if export else load(model_path)
    ref = load(ref_path) if ref_path else None
    distilled = model.source.get("distilled_ctx") if export else model.config.extra.get("distilled_ctx")
    reports = []
    for length in ctx:
        warn_beyond_distillation(model_path, distilled, length)
        report, logits, windows = evaluate(model, str(model_path), text, length, max_tokens, ref, ref_path, ref_logits)
        if not export:  # sizes as the files store them, as info gives them (an export's are its files' already)
            report["model"].update(stored_size(model_path, report["model"]["parameters"]))
        if ref_path:
            report["ref_model"].update(stored_size(ref_path, report["ref_model"]["parameters"]))
        reports.append(report)
    if logits_out:
        save_reference(logits_out, logits, windows, report)
    if json_out:
        with json_out.write() as tmp:
            tmp.write_text(json.dumps(report if len(reports) == 1 else {"contexts": reports}, indent=2) + "\n")
    click.echo(format_eval_report(report) if len(reports) == 1 else format_context_rows(reports))


def format_context_rows(reports: list[dict]) -> str:
    """One row per window length: windows, tokens scored, perplexity, bits per byte (and the drift)."""
    m, t = reports[0]["model"], reports[0]["text"]
    drift = "drift" in reports[0]
    head = "| ctx | windows | PPL | bits per byte |" + (" KLD mean | top-1 |" if drift else "")
    lines = [f"model  {m['name']}: {m['family']}, form {m['form']}, {m['parameters']:,} parameters",
             f"text   {t['name']} ({t['bytes']:,} bytes, sha256 {t['sha256']})" +
             (f"; reference {reports[0]['ref_model']['name']}" if drift else ""),
             head, "|" + "---:|" * (head.count("|") - 1)]
    for r in reports:
        row = f"| {r['ctx']} | {r['windows']} | {r['ppl']:.4f} | {r.get('bits_per_byte', float('nan')):.4f} |"
        if drift:
            row += f" {r['drift']['kld_mean']:.6f} | {100 * r['drift']['top1']:.2f}% |"
        lines.append(row)
    return "\n".join(lines)


def warn_beyond_distillation(name, distilled_ctx: int | None, tokens: int) -> None:
    """A parallel form is tuned at one window length (`distilled_ctx` in its config.json); its drift
    grows fast beyond it."""
    if distilled_ctx is not None and tokens > distilled_ctx:
        click.echo(f"warning: {name} was distilled at {distilled_ctx} tokens; at {tokens} its drift from the "
                   "original grows fast (the shipped models' MODEL_CARD.md have numbers)", err=True)


def format_eval_report(r: dict) -> str:
    m, t = r["model"], r["text"]
    lines = [
        f"model  {m['name']}: {m['family']}, form {m['form']}"
        + (", an export run by ONNX Runtime" if m.get("runtime") == "onnxruntime" else "")
        + f", {m['parameters']:,} parameters, "
        f"{m['size_mb']:.2f} MB, {m['bits_per_weight']:.2f} bits per weight",
        f"text   {t['name']} ({t['bytes']:,} bytes, sha256 {t['sha256']}): {r['windows']} windows x {r['ctx']} tokens",
        "====== Perplexity statistics ======",
        f"Mean PPL                  : {r['ppl']:10.4f}",
        f"Bits per byte             : {r.get('bits_per_byte', float('nan')):10.4f}",
    ]
    d = r.get("drift")
    if d:
        lines[-2:] = [
            f"Mean PPL(model)           : {d['model']['ppl']:10.4f}",
            f"Mean PPL(ref)             : {d['ref']['ppl']:10.4f}   ({r['ref_model']['name']})",
            f"PPL ratio, difference     : {d['ppl_ratio']:10.4f}, {d['ppl_diff']:+.4f}",
            f"Bits per byte (model, ref): {d['model'].get('bits_per_byte', float('nan')):10.4f}, "
            f"{d['ref'].get('bits_per_byte', float('nan')):.4f}",
            "====== KL divergence statistics ======",
            f"Mean    KLD: {d['kld_mean']:10.6f} +/- {d['kld_stderr']:.6f}",
            f"Maximum KLD: {d['kld_max']:10.6f}",
            f"99.9%   KLD: {d['kld_p999']:10.6f}",
            f"99.0%   KLD: {d['kld_p99']:10.6f}",
            f"90.0%   KLD: {d['kld_p90']:10.6f}",
            f"Median  KLD: {d['kld_median']:10.6f}",
            "====== Token probability statistics ======",
            f"RMS dp     : {100 * d['rms_dp']:9.3f} %",
            f"Same top p : {100 * d['top1']:9.3f} %",
            "KLD by position (bucket: mean): " + "  ".join(
                f"{i}:{v:.5f}" for i, v in enumerate(d["kld_by_position"])),
        ]
    return "\n".join(lines)


@cli.command()
@torch_threads
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info(model_path, as_json):
    """Family, form, sizes, parameter count and decode-state bytes of MODEL; the context a parallel form was
    distilled at, a decayed form's gammas, and the layers that never commit (they remember nothing past a
    mini-batch)."""
    from . import load
    from .evaluation import model_facts
    from .runner import is_export

    if is_export(model_path):
        return export_info(Path(model_path), as_json)
    model = load(model_path)
    c = model.config
    state = model.init_state(1)
    size = model_facts(model, str(model_path))
    size.update(stored_size(model_path, size["parameters"]))
    facts = {
        "path": str(model_path),
        "family": c.family,
        "form": c.form,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "layers": c.num_hidden_layers,
        **family_sizes(c),
        "parameters": size["parameters"],
        "weights_bytes": round(size["size_mb"] * 1e6),  # as the files store them
        "bits_per_weight": size["bits_per_weight"],
        "quantization": c.quantization,
        "decode_state_bytes_per_sequence": model.decode_state_bytes(),
        "decode_state_tensors": {k: list(t.shape[1:]) for k, t in state.layers[0].items()},
        "tokenizer": model.tokenizer.name if model.tokenizer else None,
        "distilled_ctx": c.extra.get("distilled_ctx"),
        "state_decay": state_decays(model),
        "commit_weights": commit_weights(model),
    }
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    options = ", ".join(k for k, v in facts["options"].items() if v) or "none"
    per_layer = ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in facts["decode_state_tensors"].items())
    click.echo("\n".join([
        f"{facts['path']}: {c.family}, form {c.form}",
        f"  vocab {c.vocab_size}, hidden {c.hidden_size}, {c.num_hidden_layers} layers, " + size_line(c),
        f"  options: {options}; tokenizer: {facts['tokenizer']}",
        f"  parameters: {facts['parameters']:,} ({facts['weights_bytes'] / 1e6:.2f} MB, "
        f"{facts['bits_per_weight']:.2f} bits per weight)"
        + (f"; quantized: {quantization_line(c.quantization)}" if c.quantization else ""),
        f"  decode state: {facts['decode_state_bytes_per_sequence']:,} bytes per sequence "
        f"(per layer: {per_layer})",
        *([f"  distilled at {facts['distilled_ctx']} tokens: its drift from the original grows beyond that"]
          if facts["distilled_ctx"] else []),
        *([decay_line(facts["state_decay"])] if facts["state_decay"] else []),
        *never_commit_line(facts["commit_weights"], getattr(c, "mini_batch_size", None)),
    ]))


def quantization_line(q: dict) -> str:
    """A quantized model's record on one line; a mix as its budget and how many layers took each variant."""
    if not q.get("target"):
        return json.dumps(q)
    counts = collections.Counter(q.get("overrides", {}).values())
    return (f"mixed precision for {q['target']}: " + ", ".join(f"{n} x {v}" for v, n in counts.most_common())
            + f"; state {q.get('state')}")


def export_info(directory: Path, as_json: bool) -> None:
    """`info` of an export: what its manifest says of the model, and its files' bytes on disk."""
    import numpy as np

    from .runner import export_files, load_manifest

    m = load_manifest(directory)
    source = m.get("source", {})
    files = export_files(directory)
    state_bytes = sum(math.prod(s["shape"]) * np.dtype(s["dtype"]).itemsize for s in m["state"])
    facts = {"path": str(directory), "export": True, "family": source.get("family"), "form": source.get("form"),
             "model": source.get("model"), "vocab_size": m["vocab_size"], "parameters": source.get("weights"),
             "files_bytes": files, "weights_bytes": sum(files.values()), "activations": m.get("activations"),
             "quantization": source.get("quantization"), "decode_state_bytes_per_sequence": state_bytes,
             "tokenizer": m["tokenizer"]["type"], "opset": m.get("opset"), "distilled_ctx": source.get("distilled_ctx")}
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    bits = 8 * facts["weights_bytes"] / facts["parameters"] if facts["parameters"] else float("nan")
    click.echo("\n".join([
        f"{directory}: an export of {facts['model']} ({facts['family']}, form {facts['form']}), opset {facts['opset']}",
        f"  vocab {facts['vocab_size']}; tokenizer: {facts['tokenizer']}; activations {facts['activations']}",
        "  files: " + ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in files.items())
        + f" ({facts['weights_bytes'] / 1e6:.2f} MB, {bits:.2f} bits per weight)"
        + (f"; quantized: {quantization_line(facts['quantization'])}" if facts["quantization"] else ""),
        f"  decode state: {state_bytes:,} bytes per sequence",
    ]))


def commit_weights(model) -> list[float] | None:
    """Each TTT layer's commit weight (`commit_weight`: eta_tok of its mini-batch's last token); None for a
    model without them (LaCT)."""
    blocks = [getattr(layer, "seq_modeling_block", None) for layer in model.model.layers]
    if not all(hasattr(block, "commit_weight") for block in blocks):
        return None
    return [round(block.commit_weight(), 6) for block in blocks]


def never_commit_line(weights: list[float] | None, b: int | None) -> list[str]:
    """A line naming the layers whose commit weight is 0: they never carry anything past a mini-batch."""
    idle = [str(i + 1) for i, w in enumerate(weights or []) if w <= 0]
    if not idle:
        return []
    many = len(idle) > 1
    return [f"  layer{'s' if many else ''} {', '.join(idle)} of {len(weights)} never commit{'' if many else 's'} "
            f"(commit weight 0): {'each' if many else 'it'} mixes only within its mini-batch of {b} tokens, "
            "remembering nothing past it"]


def state_decays(model) -> list[list[float]] | None:
    """A decayed parallel form's gamma a mini-batch, per layer and head; None for any other model."""
    if not getattr(model.config, "state_decay", False):
        return None
    return [[round(g, 6) for g in layer.seq_modeling_block.decay(1).gamma.tolist()] for layer in model.model.layers]


def decay_line(gammas: list[list[float]]) -> str:
    flat = sorted(g for layer in gammas for g in layer)
    lo, mid, hi = flat[0], flat[len(flat) // 2], flat[-1]
    line = f"  state decay: gamma a mini-batch {lo:.4f} / {mid:.4f} / {hi:.4f} (min / median / max"
    if not 0 < mid < 1:  # (no half-life to give)
        return line + ")"
    return (line + f" of {len(flat)} heads): what a head has learned fades to half in "
            f"{math.log(0.5) / math.log(mid):.0f} mini-batches (median)")


def family_sizes(c) -> dict:
    """The sizes and switches `info` reports beside the common ones, per family."""
    if c.family == "lact":
        return {"intermediate_size": c.mlp_size, "attention_heads": c.num_attn_heads, "window": c.window_size,
                "lact_heads": c.num_lact_heads, "fast_weight_dims": [c.fw_head_dim, c.fw_hidden_dim],
                "chunk": c.lact_chunk_size,
                "options": {k: getattr(c, k) for k in ("use_momentum", "use_muon", "lact_update_w0_w2",
                                                       "lact_weight_norm", "ttt_prenorm", "ttt_nope",
                                                       "learnable_ttt_scale", "tie_word_embeddings")}}
    return {"intermediate_size": c.intermediate_size, "heads": c.num_attention_heads, "head_dim": c.head_dim,
            "mini_batch_size": c.mini_batch_size,
            "options": {k: getattr(c, k) for k in ("share_qk", "pre_conv", "use_gate", "tie_word_embeddings")}}


def size_line(c) -> str:
    if c.family == "lact":
        return (f"MLP {c.mlp_size}; window attention {c.num_attn_heads} heads of {c.attn_head_dim} over "
                f"{c.window_size} tokens; {c.num_lact_heads} LaCT heads of {c.fw_head_dim} (hidden "
                f"{c.fw_hidden_dim}), chunk {c.lact_chunk_size}")
    return (f"intermediate {c.intermediate_size}, {c.num_attention_heads} heads of {c.head_dim}, "
            f"mini-batch {c.mini_batch_size}")


@cli.command("export")
@torch_threads
@click.argument("model_path", metavar="MODEL")
@click.argument("out", type=click.Path())
@click.option("--opset", default=21, show_default=True, type=click.IntRange(21, 23),
              help="ONNX opset of the default domain (21: per-axis QuantizeLinear, as ONNX Runtime >= 1.17 reads it).")
@click.option("--verify-data", default="python-docs-sample", show_default=True,
              help="Text the graphs are checked on in onnxruntime against torch.")
@click.option("--no-verify", is_flag=True, help="Skip the onnxruntime check.")
@click.option("--activations", type=click.Choice(["int8", "float"]), default="int8", show_default=True,
              help="How int8 and int4 layers multiply: int8 quantizes the activations and multiplies in integers "
                   "where that is faster (decode: MatMulNBits accuracy level 4; prefill: DynamicQuantizeMatMul for "
                   "q/k/v and gate/up, int8 rows made when the session loads, more memory while loading; a KLD cost "
                   "the verification reports); float multiplies in fp32.")
@click.option("--web", is_flag=True,
              help="Also make OUT a page that runs the model in a browser (onnxruntime-web's WebAssembly, vendored at "
                   "a pinned version: downloaded once, then cached): OUT/index.html and OUT/edgettt.mjs; serve OUT with "
                   "any static server. MODEL may be an existing export (copied, not traced again). Quantized weights "
                   "default to --activations float here: the browser's MatMulNBits multiplies in float.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
def export_cmd(model_path, out, opset, verify_data, no_verify, activations, web, force):
    """Export a parallel-form model or a LaCT model in either form (float or quantized) for ONNX
    Runtime: OUT/prefill.onnx (any batch and length, returns logits and the states; LaCT's
    chunk-recurrent form and a quantized fast-weight state as one ONNX Scan over the chunks),
    OUT/decode.onnx (one token, the states in and out)
    and OUT/manifest.json (graph inputs/outputs and their roles, state tensors, tokenizer,
    quantization, source fingerprint, verification). With a float state, OUT also opens in
    onnxruntime-genai (og.Model(OUT)): OUT/model.onnx (both graphs in one, a layer's state in the
    recurrent_state and conv_state genai binds), OUT/genai_config.json and the tokenizer files it reads.

    Both graphs share one OUT/weights.bin. int4 and int8 weights become com.microsoft.MatMulNBits
    (4 and 8 bits) and nf4/fp4 com.microsoft.MatMulBnb4 over the model's own bytes; a tied embedding
    whose lm_head is quantized (--lm-head) gathers its rows from the same bytes
    (GatherBlockQuantized); an int8 state crosses the graphs as int8 (QuantizeLinear/DequantizeLinear
    with the calibrated scales). By default both graphs run in onnxruntime on --verify-data and must
    match torch (float weights: within 10x torch's own fp32 rounding; an int8 state: KLD <= 1e-4; int8
    activations: KLD <= 5e-3; prefill-then-decode equal to prefill by the same rule, and genai's
    model.onnx equal to both); otherwise nothing is written.
    """
    from . import load
    from .data import read_text
    from .checkpoint import stored_config
    from .onnx import EXPORTABLE_FORMS, default_activations, export_model, unexportable_form
    from .onnx_files import WEIGHTS_FILE, graph_bytes
    from .outputs import Output
    from .runner import is_export

    if is_export(model_path) and not web:
        raise EdgetttError(f"{model_path}: already an export; add --web to make a browser folder of it, or give a "
                           "model directory")
    out = Output.plan(out, "export", force, inputs=[model_input(model_path), text_input(verify_data)])
    runtime = web_runtime() if web else None  # downloaded (or found in the cache) before any work
    if is_export(model_path):
        from .web import copy_export
        data = copy_export(model_path, out, runtime)
        click.echo(f"wrote {out.path}: {model_path} with {web_line(data)}")
        return
    config = stored_config(model_path)  # the form, before the weights are read
    if config is not None and config.form not in EXPORTABLE_FORMS:
        raise EdgetttError(f"{model_path}: {unexportable_form(config.form)}")
    text = None if no_verify else read_text(verify_data)
    model = load(model_path)
    if click.get_current_context().get_parameter_source("activations").name == "DEFAULT":
        activations = default_activations(web)
    click.echo(f"exporting {model_path} ({model.config.family}, form {model.form}) to {out.path} ...", err=True)
    data = export_model(model, out, str(model_path), opset=opset, verify_text=text, activations=activations,
                        log=lambda line: click.echo(line, err=True), web=runtime)
    sizes = {g["file"]: graph_bytes(out.path / g["file"]) for g in data["graphs"].values()}
    click.echo(f"wrote {out.path}: " + ", ".join(f"{f} {n / 1e6:.2f} MB" for f, n in sizes.items()) +
               f" (each with the weights it reads; {WEIGHTS_FILE} {(out.path / WEIGHTS_FILE).stat().st_size / 1e6:.2f} "
               "MB on disk, shared), manifest.json" +
               (f", {data['genai']['graph']} and {data['genai']['config']} for onnxruntime-genai"
                if data["genai"]["written"] else f" (no onnxruntime-genai files: {data['genai']['why']})"))
    if "verification" in data:
        click.echo(f"verified in onnxruntime ({data['verification']['rule']}): {data['verification']['summary']}")
    if web:
        click.echo(f"and {web_line(data)}")


def web_runtime() -> dict[str, bytes]:
    from .web import runtime_files
    return runtime_files()


def web_line(manifest: dict) -> str:
    """What --web added: the page and what it fetches (what a visitor downloads)."""
    return (f"a browser page: index.html, edgettt.mjs and onnxruntime-web {manifest['web']['onnxruntime_web']} "
            f"(serve the folder with any static server, e.g. python -m http.server, and open index.html)"
            + (f"; note: {manifest['web']['note']}" if manifest["web"].get("note") else ""))


class SamplingSpec(click.ParamType):
    """--sampling top-k=K,top-p=P,seed=N: the samplers beside temperature, as keyword settings."""

    name = "SETTINGS"
    KEYS = {"top-k": ("top_k", COUNT), "top-p": ("top_p", FiniteFloat(0, 1, min_open=True)), "seed": ("seed", SEED)}

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        out = {}
        for item in filter(None, value.split(",")):
            key, eq, text = item.partition("=")
            if not eq or key not in self.KEYS:
                self.fail(f"{item!r} is not KEY=VALUE with KEY one of {', '.join(self.KEYS)}", param, ctx)
            name, kind = self.KEYS[key]
            out[name] = kind.convert(text, param, ctx)
        return out


@cli.command("run")
@click.argument("export_dir", metavar="EXPORT", type=click.Path())
@click.option("--prompt", default=None, help="Text to continue (after --load-state: the text continues the saved one).")
@click.option("--max-new-tokens", default=64, show_default=True, type=COUNT, help="Tokens to generate (a chat turn's "
              "reply ends at a line break or here).")
@click.option("--temperature", default=0.0, show_default=True, type=FiniteFloat(min=0), help="0: greedy.")
@click.option("--repetition-penalty", default=1.1, show_default=True, type=FiniteFloat(min=1),
              help="Divide the positive logits of tokens among the last 64 by this, multiply the negative "
                   "(llama.cpp's default), and stop runs of one token at 16 in a row (greedy decoding of the tiny "
                   "models repeats spaces without it); 1: both off, plain greedy or sampling as other runtimes do.")
@click.option("--sampling", default="", type=SamplingSpec(), metavar="SETTINGS",
              help="top-k=K (sample from the k likeliest tokens; 0: all), top-p=P (from the likeliest whose "
                   "probabilities reach p), seed=N (0 by default); comma-separated, e.g. top-k=40,top-p=0.9.")
@click.option("--stop", multiple=True, metavar="TEXT", help="End when the generated text ends with TEXT (repeatable).")
@click.option("--load-state", default=None, type=click.Path(), metavar="FILE",
              help="Start from a state saved by --save-state (checked against this export).")
@click.option("--save-state", default=None, type=click.Path(), metavar="FILE",
              help="Write the state after the prompt and the generated text (a safetensors file): a later "
                   "--load-state continues from there.")
@click.option("--chat", is_flag=True, help="Then read turns from stdin, a line each, and reply to each, all in one "
                                           "state: the memory stays the same however long the chat.")
@click.option("--threads", default=None, type=click.IntRange(1, 1024),
              help="onnxruntime intra-op threads [default: its own].")
@click.option("--json", "json_path", default=None, type=click.Path(), help="Write the timings here.")
@click.option("--force", is_flag=True, help="Overwrite the --json and --save-state files.")
def run_cmd(export_dir, prompt, max_new_tokens, temperature, repetition_penalty, sampling, stop, load_state,
            save_state, chat, threads, json_path, force):
    """Generate from an export with onnxruntime and numpy only (no torch needed): prefill the prompt,
    then decode token by token, streaming the text; prints tokens/s and peak memory at the end.
    A state can be saved after the text and loaded to continue it later; --chat keeps one state
    across turns read from stdin."""
    from .outputs import plan_outputs
    from .runner import Runner, Sampling, peak_memory_mb

    if prompt is None and not (load_state or chat):
        raise click.UsageError("give --prompt TEXT (or --load-state FILE to continue a saved text, or --chat)")
    json_out, state_out = plan_outputs((json_path, "json", force, "--json"), (save_state, "state", force, "--save-state"),
                                       inputs=[export_dir, load_state])
    runner = Runner(export_dir, threads)
    if load_state:
        runner.load_state(load_state)
    warn_beyond_distillation(export_dir, runner.manifest["source"].get("distilled_ctx"),
                             len(runner.tokenizer.encode(prompt or "")) + max_new_tokens)
    sampler = Sampling(temperature, sampling.get("top_k", 0), sampling.get("top_p", 1.0), repetition_penalty,
                       max_run=16 if repetition_penalty > 1 else 0)
    seed = sampling.get("seed", 0)
    stats: dict = {}
    if prompt is not None or not chat:  # (a loaded state alone: generation continues it)
        click.echo(prompt or "", nl=False)
        for piece in runner.generate(prompt or "", max_new_tokens, seed=seed, stats=stats, sampling=sampler,
                                     stop=stop, resume=True):
            click.echo(piece, nl=False)
        click.echo("")
    if chat:
        stats = chat_turns(runner, max_new_tokens, sampler, seed, stop)
    stats["peak_memory_mb"] = peak_memory_mb()
    click.echo(f"prefill {stats['prompt_tokens']} tokens at {stats['prefill_tokens_per_s']:.1f} tokens/s; "
               f"decode {stats['new_tokens']} tokens at {stats['decode_tokens_per_s']:.1f} tokens/s; "
               f"peak memory {stats['peak_memory_mb']:.0f} MB", err=True)
    if state_out:
        runner.save_state(state_out)
        click.echo(f"wrote {state_out.path}: the state after {runner.current.position} tokens", err=True)
    if json_out:
        with json_out.write() as tmp:
            tmp.write_text(json.dumps(stats, indent=2) + "\n")


def chat_turns(runner, max_new_tokens: int, sampler, seed: int, stop) -> dict:
    """`run --chat`: each line of stdin is read into the runner's one state, then a reply is generated
    until a line break; returns the last turn's timings with the number of turns."""
    stats: dict = {"prompt_tokens": 0, "new_tokens": 0, "prefill_tokens_per_s": 0.0, "decode_tokens_per_s": 0.0}
    stdin = sys.stdin.buffer
    for turn, raw in enumerate(iter(stdin.readline, b""), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = None
        if line is None or "\0" in line:
            raise click.ClickException(f"stdin line {turn}: not UTF-8 text; give the chat plain text, a turn a line "
                                       "(nothing was saved)")
        if not line.strip():
            continue
        line = line if line.endswith("\n") else line + "\n"
        stats = {}
        for piece in runner.generate(line, max_new_tokens, seed=seed + turn, stats=stats, sampling=sampler,
                                     stop=("\n", *stop), resume=True):
            click.echo(piece, nl=False)
        if not runner.tokenizer.decode(stats["tokens"]).endswith("\n"):
            click.echo("")
        stats["turns"] = turn
    return stats


def int_list(ctx, param, value, low: int = 1):
    try:
        values = [int(v) for v in value.split(",") if v]
    except ValueError:
        values = None
    if values is None or any(v < low for v in values):
        what = "positive integers" if low == 1 else f"integers >= {low}"
        raise click.BadParameter(f"{value!r}: expected comma-separated {what}, e.g. {param.default}")
    return values


def count_list(ctx, param, value):
    return int_list(ctx, param, value, low=0)


@cli.command()
@click.argument("paths", nargs=-1, metavar="PATH...")
@click.option("--pp", default="512", show_default=True, callback=int_list, help="Prefill lengths (comma-separated).")
@click.option("--tg", default="128", show_default=True, callback=int_list, help="Decoded tokens (comma-separated).")
@click.option("--depth", default="0", show_default=True, callback=count_list,
              help="Tokens of context before the decode (comma-separated).")
@click.option("-r", "--repetitions", default=5, show_default=True, type=POSITIVE)
@click.option("--threads", default=None, type=POSITIVE,
              help="onnxruntime / torch threads of each worker [default: their own].")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the random token ids.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: models through torch on the GPU as `edgettt.prepare` makes them (bfloat16, Triton "
                   "kernels, decode compiled and replayed as CUDA graphs, prefill timed as a graph replay).")
@click.option("--batch", default=1, show_default=True, type=POSITIVE, help="Sequences prefilled and decoded together.")
@click.option("--json", "json_path", default=None, type=click.Path(),
              help="Write every row here (rewritten after each repetition: a run cut short keeps what it measured).")
@click.option("--markdown", "md_path", default=None, type=click.Path(), help="Write the table here.")
@click.option("--force", is_flag=True, help="Overwrite the output files.")
def bench(paths, pp, tg, depth, repetitions, threads, seed, device, batch, json_path, md_path, force):
    """Tokens a second a model prefills and decodes, in the manner of llama-bench.

    \b
    PATH     an export directory (ONNX Runtime on the CPU: the edge path), a model (torch), or an
             onnxruntime-genai model folder (a transformer with its KV cache: the anchor; needs
             onnxruntime-genai), or genai:EXPORT (an export run by onnxruntime-genai instead of
             edgettt's runner); with --device cuda, models and llama:<preset> (a Llama of that
             preset's size with a static KV cache, SDPA: the baseline)
    ppN      prefill N tokens from a fresh state (the logits of the last one, as llama-bench)
    tgN@dD   decode N tokens one at a time after D tokens of context (D = 0: after one token)

    One measurement at a time, after an untimed warm-up run; the paths take turns, repetition after
    repetition. On the CPU every measurement runs in a fresh worker process (its peak resident memory
    its own); with --device cuda each path keeps one worker for the run (a model loads and compiles
    once), and the peak is the GPU memory allocated during the test. Printed and written: the median
    tokens/s, min and max, the median ratio to the first PATH, peak memory and size on disk (and the
    decode graph's nodes for an export); on CUDA each row against its hardware limit. Token ids are
    random: speed does not depend on them.
    """
    from .benchmark import run, table, tests, write
    from .outputs import plan_outputs

    json_out, md_out = plan_outputs((json_path, "json", force, "--json"), (md_path, "markdown", force, "--markdown"),
                                    inputs=[model_input(p) for p in paths if not p.startswith("llama:")])
    result = run(list(paths), tests(pp, tg, depth), repetitions, threads, seed, device, batch,
                 partial=lambda so_far: write(so_far, json_out, md_out))  # rewritten after every repetition
    click.echo(table(result))
    write(result, json_out, md_out)


def main():
    cli(prog_name="edgettt")
