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
from pathlib import Path

import click

from edgettt.errors import EdgetttError

class Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # Ctrl-C: outputs are staged and renamed when complete, so none is half-written
            click.echo("\ninterrupted: nothing was written or replaced", err=True)
            ctx.exit(130)
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
        from edgettt.quant.config import weight_variant

        try:
            weight_variant(value)
        except EdgetttError as exc:
            self.fail(str(exc).split(": ", 1)[1], param, ctx)
        return value


class Checked(click.ParamType):
    """A value checked by one of edgettt's parsers, imported when used (they import torch; `edgettt run` starts
    without it): its one-line refusal is a malformed command line (exit 2), as click's own are."""

    def __init__(self, name: str, check):
        self.name, self.check = name, check

    def convert(self, value, param, ctx):
        try:
            return self.check(value)
        except EdgetttError as exc:
            self.fail(str(exc).split(": ", 1)[-1], param, ctx)


def budget(text: str):
    from edgettt.calibration.mixed import Budget

    return Budget.parse(text)


def weight_variants(text: str) -> list[str]:
    from edgettt.reporting import weight_variant_or_mix

    names = [w.strip() for w in text.split(",") if w.strip()] if isinstance(text, str) else list(text)
    for name in names:
        weight_variant_or_mix(name)
    return names


def state_variants(text: str) -> list[str]:
    return [state_format_name(s.strip()) for s in text.split(",") if s.strip()] if isinstance(text, str) else text


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
    """A state format's name; an old one (`formats.state_formats.RENAMED`) is taken with a note."""

    def convert(self, value, param, ctx):
        try:
            return state_format_name(value)
        except EdgetttError as exc:
            self.fail(str(exc).split(": ", 1)[1], param, ctx)


def state_format_name(value: str) -> str:
    """Today's name of a state format a user gave (an old name with a note), or a one-line error."""
    from edgettt.formats.state_formats import RENAMED, STATE_FORMATS, renamed_note

    if value in RENAMED:
        click.echo(renamed_note(value), err=True)
        value = RENAMED[value]
    if value not in STATE_FORMATS:
        raise EdgetttError(f"--state: unknown state format {value!r}; use {', '.join(STATE_FORMATS)}")
    return value


def state_format_names() -> list[str]:
    from edgettt.formats.state_formats import STATE_FORMATS

    return list(STATE_FORMATS)


def head_formats() -> list[str]:
    from edgettt.quant.config import HEAD_FORMATS

    return list(HEAD_FORMATS)


def fallbacks() -> list[str]:
    from edgettt.quant.config import FALLBACKS

    return list(FALLBACKS)


class RegistryHelp(click.Option):
    """An option whose help lists one of edgettt's registries, made when the help is shown (the registries import
    torch; `edgettt run` starts without it)."""

    def __init__(self, *args, make_help, **kwargs):
        super().__init__(*args, **kwargs)
        self.make_help = make_help

    def get_help_record(self, ctx):
        self.help = self.make_help()
        return super().get_help_record(ctx)


def weights_help() -> str:
    from edgettt.quant.weight_formats import WEIGHT_FORMATS

    return (f"FORMAT[-METHOD][-gGROUP] of {', '.join(WEIGHT_FORMATS)}, or float; e.g. int4-gptq-g32 (gptq needs "
            "--calib). --list: each format.")


def target_help() -> str:
    from edgettt.calibration.mixed import CANDIDATES

    return f"Mixed precision (needs --calib): each layer's variant among {', '.join(CANDIDATES)}."


def list_formats(ctx, param, value) -> None:
    """`quantize --list`: the registries' weight and state formats, a line each (llama-quantize's table)."""
    if not value or ctx.resilient_parsing:
        return
    from edgettt.formats.state_formats import STATE_FORMATS
    from edgettt.quant.weight_formats import WEIGHT_FORMATS

    lines = ["weight formats (--weights FORMAT[-METHOD][-gGROUP]):"]
    lines += [f"  {name:12s} {'/'.join(f.methods):9s} {f.summary}" for name, f in WEIGHT_FORMATS.items()]
    lines += ["state formats (--state):"]
    lines += [f"  {name:12s} {f.summary}" for name, f in STATE_FORMATS.items()]
    click.echo("\n".join(lines))
    ctx.exit(0)


POSITIVE = click.IntRange(min=1)
COUNT = click.IntRange(min=0)
SEED = click.IntRange(min=0, max=2**32 - 1)


def torch_threads(command):
    """Add --threads to a command that runs torch, and set torch's CPU threads before it runs."""
    @click.option("--threads", type=click.IntRange(1, 1024), default=None,
                  help="torch CPU threads [default: the idle cores].")
    @functools.wraps(command)
    def run_with_threads(*args, threads=None, **kwargs):
        import torch

        from edgettt.threads import idle_cores

        if threads is None:
            threads = idle_cores(torch.get_num_threads())
        torch.set_num_threads(threads)
        return command(*args, **kwargs)
    return run_with_threads


def registry():
    """The families' registry (imported when a command needs it: it imports torch)."""
    from edgettt.families import registry as families

    return families


def config_settings(pairs: tuple[str, ...], defaults: dict) -> dict:
    """`--set KEY=VALUE` pairs as config values of `defaults`' keys: positive integers, or true/false for the
    switches."""
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in defaults:
            raise click.BadParameter(f"{pair!r}: unknown key {key!r}; use one of {', '.join(defaults)}",
                                     param_hint="--set")
        if isinstance(defaults[key], bool):
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
    from edgettt.checkpoint import resolve_model_path

    return None if spec is None else resolve_model_path(spec)


def text_input(spec):
    """The file or folder a TEXT option names, or None for stdin and built-in texts."""
    from edgettt.data import text_path

    return text_path(spec)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgettt")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def cli(no_progress):
    """Take TTT-KV language models (TTT-Linear, TTT-MLP, LaCT) to the edge as linear attention.

    MODEL: a model directory or a shipped model (ttt-linear-tiny, ttt-mlp-tiny, their -parallel forms,
    lact-tiny, lact-w1-tiny). TEXT: a file, a folder of .txt/.md, '-' (stdin) or a built-in text
    (python-docs:train to calibrate and distil on, python-docs to measure). Exit codes: 1 bad input or a
    failed run, 2 a malformed command line, 130 interrupted. The manual: docs/cli.md."""
    if no_progress:
        os.environ["TQDM_DISABLE"] = "1"  # progress.bar reads it for every bar
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:  # started by torchrun: one of several processes
        command = click.get_current_context().invoked_subcommand
        if command not in DISTRIBUTED_COMMANDS:
            raise EdgetttError(f"torchrun runs {' and '.join(DISTRIBUTED_COMMANDS)} over several processes; run "
                               f"`edgettt {command}` on its own")
        if os.environ.get("RANK", "0") != "0":  # rank 0 speaks for the job; the others only report their errors
            os.environ["TQDM_DISABLE"] = "1"
            sys.stdout = open(os.devnull, "w")


DISTRIBUTED_COMMANDS = ("convert", "calibrate")


def distributed_command(command):
    """A command torchrun may start several times: join the job's processes before it runs (`edgettt.distributed`;
    EDGETTT_BACKEND=gloo|nccl picks their communication, else NCCL on GPUs and gloo on the CPU), so that a lost
    rank ends it in a line, and leave the process group when it ends."""
    @functools.wraps(command)
    def run_distributed(*args, **kwargs):
        from edgettt import distributed

        ranks = distributed.start(os.environ.get("EDGETTT_BACKEND") or None)
        try:
            with distributed.collectives(ranks):
                result = command(*args, **kwargs)
                distributed.barrier(ranks)  # every rank done before any leaves the group (not after a failure)
                return result
        finally:
            distributed.stop()
    return run_distributed


@cli.command(short_help="a random checkpoint, to try the pipeline")
@torch_threads
@click.argument("out", type=click.Path())
@click.option("--family", "kind", type=RegistryChoice(lambda: registry().create_kinds()), default="linear",
              show_default=True, help="TTT-Linear, TTT-MLP, Gated DeltaNet or DeltaNet.")
@click.option("--preset", type=RegistryChoice(lambda: registry().preset_names()), default=None,
              help="A published size (vocabulary 32000): ttt-lm-pytorch's 125m-1b, fla's 340m and 1.3b.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", cls=RegistryHelp,
              make_help=lambda: "A config.json key: " + ", ".join(registry().create_settings()) + " (docs/cli.md).")
@click.option("--tokenizer", "tokenizer_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="A tokenizer.json [default: byte-level].")
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--weights-format", type=click.Choice(["safetensors", "bin"]), default="safetensors",
              show_default=True)
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
def create(out, kind, preset, settings, tokenizer_file, seed, weights_format, force):
    """Write a randomly initialised checkpoint (ttt-lm-pytorch's layout for TTT, flash-linear-attention's for
    DeltaNet) to OUT: a small byte-level one (--set sizes it; defaults in docs/cli.md), or a published size
    (--preset: for speed and size, not text)."""
    from edgettt.checkpoint import save_model
    from edgettt.outputs import Output
    from edgettt.tokenizer import JsonTokenizer

    _, creator = registry().creator_of(kind)
    defaults = creator.defaults[kind]
    settings = config_settings(settings, defaults)  # (read here: which keys a family takes depends on --family)
    sizes = {**defaults, **settings}
    tokenizer = JsonTokenizer(Path(tokenizer_file)) if tokenizer_file else None
    if tokenizer is not None and "vocab_size" not in settings:
        sizes["vocab_size"] = tokenizer.vocab_size
    if preset:
        presets = creator.presets[kind]
        if preset not in presets:
            raise click.BadParameter(f"{preset!r} is not a published size of --family {kind}; use one of "
                                     f"{', '.join(presets)}", param_hint="--preset")
        given = sorted(set(settings) & {*presets[preset], "vocab_size"})
        if given:
            raise EdgetttError(f"--preset {preset} sets {', '.join(given)}; leave them out of --set, or drop --preset")
        sizes.update(presets[preset], vocab_size=creator.preset_vocab)
    out = Output.plan(out, "model", force, inputs=[tokenizer_file and Path(tokenizer_file)])
    config = creator.config(kind, sizes)
    if tokenizer is not None:
        tokenizer.check_fits(config.vocab_size)
    elif config.vocab_size > 256:
        click.echo(f"note: a vocabulary of {config.vocab_size:,} with the byte-level tokenizer: text uses ids 0-255 "
                   "only, and generated ids from 256 on decode to nothing; give the model's --tokenizer", err=True)
    model = creator.random_model(config, seed)
    model.tokenizer = tokenizer or model.tokenizer
    save_model(model, out, weights_format=weights_format)
    click.echo(f"wrote {out.path}: random {config.family}, {model.num_parameters():,} parameters"
               + (f" (preset {preset}: random weights, for speed and size)" if preset else ""))


@cli.command(short_help="TTT checkpoint -> linear-attention model (+ drift)")
@torch_threads
@distributed_command
@click.argument("src", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--form", type=click.Choice(["exact", "parallel"]), default="exact", show_default=True,
              help="exact: equals SRC; parallel: values at the initial state.")
@click.option("--decay", default=None, type=FiniteFloat(min=0, max=1, min_open=True, max_open=True), metavar="GAMMA",
              help="A decayed parallel form, starting at GAMMA (e.g. 0.97).")
@click.option("--data", default=None, metavar="TEXT",
              help="Text to measure on; with --distill, to train on [default: python-docs-sample; with --distill "
                   "python-docs:train].")
@click.option("--eval-data", default=None, metavar="TEXT",
              help="With --distill: text to measure on [default: python-docs-sample].")
@click.option("--ctx", default=256, show_default=True, type=POSITIVE, help="Tokens a window.")
@click.option("--max-tokens", default=4096, show_default=True, type=POSITIVE, help="Tokens measured at most.")
@click.option("--distill", "distill_spec", is_flag=False, flag_value="", default=None, metavar="[SETTINGS]",
              help="Tune towards SRC: steps=,lr=,batch=,ctx=512/2048,minutes=,hard_weight=,pool=,shard=,save_every=,"
                   "resume= (docs/cli.md).")
@click.option("--tokenizer", "tokenizer_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="A tokenizer.json to write with the model [default: SRC's].")
@click.option("--no-report", is_flag=True, help="Convert without measuring.")
@click.option("--json", "json_path", default=None, type=click.Path(), metavar="PATH",
              help="Write the report as JSON ('-': standard output).")
@click.option("--force", is_flag=True, help="Overwrite OUT (and --json's file) if it exists.")
def convert(src, out, form, decay, data, eval_data, ctx, max_tokens, distill_spec, tokenizer_file, no_report,
            json_path, force):
    """Convert the checkpoint SRC (a model directory, a shipped model, a ttt-lm-jax checkpoint) into a
    linear-attention model in OUT, and report its drift from SRC (OUT/convert_report.json). TEXT: a file,
    a folder of .txt/.md, '-' (stdin) or a built-in text (docs/cli.md)."""
    from edgettt.api import convert_checkpoint
    from edgettt.data import read_text
    from edgettt.outputs import STDOUT, plan_outputs, write_json

    if decay is not None and form != "parallel":
        raise EdgetttError(f"--decay is for --form parallel (a decayed parallel form), not --form {form}")
    distill = distill_settings(distill_spec) if distill_spec is not None else None
    out, json_out = plan_outputs((out, "model", force, None), (json_path, "json", force, "--json"),
                                 inputs=[model_input(src), text_input(data), text_input(eval_data),
                                         tokenizer_file and Path(tokenizer_file)])
    check_convertible(src, form, distill is not None or decay is not None)
    check_distill_run(out.path, distill, force)
    measure_text = read_text(eval_data if distill else data)  # texts first: a bad one fails before any work
    train_text = read_text(data or "python-docs:train") if distill else None
    done = convert_checkpoint(src, out, form, decay, measure_text, ctx, max_tokens, measure=not no_report,
                              distill=distill, train_text=train_text, tokenizer=tokenizer_file)
    report = done.report
    if not distill and report and (note := drift_note(report, done.seconds)):
        click.echo(note, err=True)
    if json_out:
        write_json(json_out, report)
    if json_out == STDOUT:
        return
    click.echo(f"wrote {out.path}: {done.model.config.family}, form {form}"
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
    from edgettt.checkpoint import stored_config
    from edgettt.families.registry import family_of

    config = stored_config(src)
    if config is None:
        return
    if config.quantization:
        raise EdgetttError(f"{src}: a quantized model; convert the float model, then quantize the converted one")
    own = family_of(config).form_converted_to(form)
    if config.form == own and not tunes:
        what = f"the {form} form" if own == form else f"in its own form ({own}, what --form {form} gives)"
        raise EdgetttError(f"{src}: already {what}, so converting it changes nothing; convert the original "
                           "checkpoint, or add --distill to tune this one further")


def check_distill_run(out: Path, distill, force: bool) -> None:
    """Before any work: torchrun's processes have a distillation to share, and an earlier run's checkpoints
    (OUT.distill/) are continued (resume=1) or replaced (--force), never mixed with a new run's."""
    from edgettt.distributed import launched_world
    from edgettt.resume import checkpoint_folder

    checkpoints = checkpoint_folder(out)
    if launched_world() > 1 and distill is None:
        raise EdgetttError("torchrun's processes share a distillation: add --distill, or run convert on its own")
    if distill is not None and checkpoints.exists() and not distill.resume and not force:
        raise EdgetttError(f"{checkpoints}: checkpoints of an earlier distillation to {out.name}; add resume=1 to "
                           "--distill to continue it, or --force to start over")


def check_exportable_form(model_path) -> None:
    """Before any work: a converted model given to `report --onnx` must be the parallel form."""
    from edgettt.checkpoint import stored_config

    form = getattr(stored_config(model_path), "form", "ttt")  # (an original checkpoint: converted to it)
    if form not in ("ttt", "parallel"):
        raise EdgetttError(f"{model_path}: --onnx exports the parallel form, this model is the {form} form; give "
                           "the original checkpoint or a parallel-form model")


def check_unquantized(model_path, command: str, states=()) -> None:
    """Before any work: `command` (quantize, calibrate, report) starts from a model that is not quantized yet, and
    each state format in `states` applies to its family (from config.json, no weights read)."""
    from edgettt.checkpoint import stored_config
    from edgettt.families.registry import family_of

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
    model_class = family_of(config).model_class
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
    from edgettt.distill import DistillSettings

    settings = DistillSettings()
    per_token = seconds / (2 * report["windows"] * report["ctx"])
    minutes = settings.steps * settings.batch * report["ctx"] * 4 * per_token / 60
    return (f"note: the parallel form's perplexity is {100 * (ratio - 1):.0f}% above the original's: tune it "
            f"towards the original with --distill ({settings.steps} steps at --ctx {report['ctx']}, an estimated "
            f"{minutes:.0f} min on this machine from this run's speed), or keep --form exact, which does not drift")


def distill_settings(spec: str):
    """`--distill`'s SETTINGS as a `DistillSettings`, or a one-line error naming the option."""
    from edgettt.distill import DistillSettings

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


@cli.command(short_help="statistics for quantization (layer inputs, the state)")
@torch_threads
@distributed_command
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.argument("output", metavar="OUT", type=click.Path())
@click.option("--data", default="python-docs:train", show_default=True, metavar="TEXT",
              help="Sample text (see `edgettt eval --help` for the forms TEXT takes).")
@click.option("--ctx", default=2048, show_default=True, type=POSITIVE,
              help="Tokens per sample: the context to calibrate for.")
@click.option("--samples", default=8, show_default=True, type=POSITIVE, help="Number of windows drawn from the text.")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Which windows are drawn.")
@click.option("--percentile", default=99.99, show_default=True, type=FiniteFloat(0, 100, min_open=True),
              help="Clipping percentile of the state scales.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
def calibrate(model_path, data, ctx, samples, seed, percentile, output, force):
    """Record in the file OUT what quantization needs from a converted MODEL (or a LaCT model) on sample text: the input
    statistics of every linear layer (GPTQ Hessians) and the accumulated state's per-row magnitudes
    along the positions (LaCT: how far the fast weights kept between chunks move from their initial
    values), with the chosen int8 state scales."""
    from edgettt import distributed, load
    from edgettt.data import read_text
    from edgettt.outputs import Output
    from edgettt.calibration.statistics import calibrate as run_calibration

    out = Output.plan(output, "calibration", force, inputs=[model_input(model_path), text_input(data)])
    check_unquantized(model_path, "calibrate")
    ranks = distributed.current()
    ranks.share(samples, "calibrate --samples")  # (under torchrun: refused before any work)
    text = read_text(data)
    model = load(model_path)
    cal = run_calibration(model, text, ctx, samples, seed, percentile)
    if not ranks.main:  # rank 0 writes the file
        return
    cal.save(out)
    click.echo(f"wrote {output}: {len(cal.hessians)} layer input statistics, state scales for "
               f"{len(cal.state_scales)} layer levels; {cal.samples} x {cal.seq_len} tokens of {cal.text['name']} "
               f"(sha256 {cal.text['sha256']}), model {cal.model_fingerprint}")
    for key in sorted(cal.state_rowmax, key=lambda k: [int(p) if p.isdigit() else p for p in k.split(".")]):
        curve = cal.state_rowmax[key].amax((0, 1))
        click.echo(f"  layer {key:8s} max |row| by position bucket: " + " ".join(f"{v:8.3g}" for v in curve.tolist()))


@cli.command(short_help="4/6/8-bit weights, int12/int8/fp16 state")
@torch_threads
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--weights", default="int8", show_default=True, type=WeightVariant(), cls=RegistryHelp,
              make_help=weights_help)
@click.option("--state", type=StateFormatName(state_format_names), default="fp32", show_default=True,
              help="How the decode state is kept (--list: each format).")
@click.option("--calib", type=click.Path(), default=None, metavar="FILE", help="From `edgettt calibrate`.")
@click.option("--skip", multiple=True, metavar="PATTERN", help="Also keep matching layers in float.")
@click.option("--lm-head", "head", type=RegistryChoice(head_formats), default=None,
              help="[default: int8 beside 4-bit weights, else float]")
@click.option("--fallback", type=RegistryChoice(fallbacks), default="int8", show_default=True,
              help="For a layer --weights cannot take.")
@click.option("--target", default=None, type=Checked("size=MB|kld=X", budget), cls=RegistryHelp, make_help=target_help)
@click.option("--list", is_flag=True, expose_value=False, is_eager=True, callback=list_formats,
              help="List the weight and state formats, and exit.")
@click.option("--force", is_flag=True, help="Overwrite OUT.")
@click.pass_context
def quantize(ctx, model_path, out, weights, state, calib, skip, head, fallback, target, force):
    """Quantize the weights (and the decode state) of a converted MODEL into OUT. Formats, methods and the
    mixed-precision search: docs/quantization.md."""
    from edgettt.api import quantize_checkpoint
    from edgettt.calibration.mixed import check_size_budget
    from edgettt.checkpoint import skeleton
    from edgettt.outputs import Output
    from edgettt.quant.apply import skip_patterns
    from edgettt.quant.config import QuantConfig, default_head_format, weight_variant

    budget = target
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
    if budget and (shapes := skeleton(model_path)) is not None:
        check_size_budget(shapes, budget)  # from config.json, before the weights are read

    def line(row):
        click.echo(f"  {row['name']:45s} {'x'.join(map(str, row['shape'])):>9s}  {row['format']:14s} "
                   f"{row['bytes_before'] / 1e3:9.1f} kB -> {row['bytes_after'] / 1e3:8.1f} kB"
                   + ("  (fallback)" if row.get("fallback") else ""))

    done = quantize_checkpoint(model_path, out, config, calib, budget, report=line, log=click.echo)
    misfits = sum(row["fallback"] for row in done.rows)
    if misfits:
        click.echo(f"{misfits} layers cannot be {done.config.variant} (input size not a multiple of {group}): "
                   f"kept in {fallback} (--fallback)", err=True)
    click.echo(f"wrote {out.path}: {done.before['size_mb']:.2f} MB -> {done.after['size_mb']:.2f} MB, "
               f"{done.after['bits_per_weight']:.2f} bits per weight ({done.config.variant}); state {state}")


@cli.command(short_help="the whole chain: the accuracy-vs-bits table")
@torch_threads
@click.argument("model_path", metavar="[MODEL]", required=False, default="ttt-linear-tiny", type=click.Path())
@click.argument("output", metavar="[OUT]", required=False, default="edgettt-report", type=click.Path())
@click.option("--data", default="python-docs", show_default=True, metavar="TEXT", help="Text to measure on.")
@click.option("--calib-data", default="python-docs:train", show_default=True, metavar="TEXT",
              help="Text to calibrate on.")
@click.option("--weights", "weights_list", default="int8,int8-gptq,bnb-int8,int4-rtn-g64,int4-gptq-g64,nf4-b64",
              show_default=True, type=Checked("VARIANTS", weight_variants), help="Weight variants as quantize --weights takes them, or mix:size=MB|kld=X.")
@click.option("--state", "state_list", default="int12,int8,int8-tensor,fp16", show_default=True,
              type=Checked("FORMATS", state_variants),
              help="State variants (each with float weights).")
@click.option("--form", type=click.Choice(["exact", "parallel"]), default=None,
              help="Form to convert to [default: exact; with --onnx parallel].")
@click.option("--ctx", default=2048, show_default=True, type=POSITIVE, help="Tokens a window (and a calibration's).")
@click.option("--max-tokens", default=100_000, show_default=True, type=POSITIVE, help="Tokens measured at most.")
@click.option("--skip", multiple=True, metavar="PATTERN", help="Also keep matching layers in float.")
@click.option("--fallback", type=RegistryChoice(fallbacks), default="int8", show_default=True,
              help="For a layer a variant cannot take.")
@click.option("--onnx", is_flag=True, help="Also export each variant; measure its size and CPU tokens/s.")
@click.option("--force", is_flag=True, help="Overwrite OUT.")
def report(model_path, output, data, calib_data, weights_list, state_list, form, ctx, max_tokens, skip, fallback,
           onnx, force):
    """Convert, calibrate, quantize every variant and measure each against the float model: the accuracy-vs-bits
    table, printed and in OUT (report.json/.csv/.md/.html, plots). MODEL: ttt-linear-tiny unless given."""
    from edgettt import load
    from edgettt.api import report as report_model
    from edgettt.data import read_text
    from edgettt.outputs import Output
    from edgettt.reporting import table

    names, states = weights_list, state_list
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
    result = report_model(model, out, text, calib_text, names, states, form, ctx, max_tokens, skip, fallback, onnx,
                          log=click.echo, name=str(model_path)).data
    click.echo(table(result))
    click.echo(f"wrote {output}/report.json, report.csv, report.md, report.html, accuracy_vs_size.png, "
               "kld_by_position.png, state_vs_kld.png")
    if result["failed"]:
        failures = "; ".join(f"{f['variant']}: {f['error']}" for f in result["failed"])
        raise EdgetttError(f"{len(result['failed'])} variants failed ({failures}); the report in {output} holds the "
                           "others")


@cli.command("eval", short_help="perplexity, bits per byte, drift against a reference")
@torch_threads
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--ref", "ref_path", default=None, metavar="MODEL", help="Reference model to measure drift against.")
@click.option("--ref-logits", default=None, type=click.Path(), metavar="PATH", help="Saved reference logits.")
@click.option("--data", default="python-docs", show_default=True, metavar="TEXT",
              help="Text to measure on: a file, a folder, '-', a built-in text.")
@click.option("--ctx", default="512", show_default=True, callback=lambda c, p, v: int_list(c, p, v),
              help="Tokens a window; several (512,2048): a row each.")
@click.option("--max-tokens", default=100_000, show_default=True, type=POSITIVE, help="Tokens measured at most.")
@click.option("--save-logits", default=None, type=click.Path(), metavar="PATH", help="Save them as reference logits.")
@click.option("--json", "json_path", default=None, type=click.Path(), metavar="PATH",
              help="Write the report as JSON ('-': standard output).")
@click.option("--force", is_flag=True, help="Overwrite the --save-logits and --json files.")
def evaluate_cmd(model_path, ref_path, ref_logits, data, ctx, max_tokens, save_logits, json_path, force):
    """Perplexity and bits per byte of MODEL (a model or an export) on TEXT; with --ref or --ref-logits, its
    drift from the reference (KL divergence statistics, top-1 agreement, KLD by position)."""
    from edgettt import load
    from edgettt.data import read_text
    from edgettt.evaluation import ExportLogits, evaluate, save_reference
    from edgettt.model_info import stored_size
    from edgettt.outputs import STDOUT, plan_outputs, write_json
    from edgettt.runner import is_export

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
        write_json(json_out, report if len(reports) == 1 else {"contexts": reports})
    if json_out != STDOUT:
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


@cli.command(short_help="family, form, sizes, parameters, decode-state bytes")
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--json", "json_path", default=None, type=click.Path(), metavar="PATH",
              help="Write the facts as JSON ('-': standard output).")
def info(model_path, json_path):
    """Family, form, sizes, parameter count and decode-state bytes of MODEL; the context a parallel form was
    distilled at, a decayed form's gammas, and the layers that never commit (they remember nothing past a
    mini-batch)."""
    from edgettt import load
    from edgettt.model_info import model_info
    from edgettt.outputs import STDOUT, plan_outputs, write_json
    from edgettt.runner import is_export

    if is_export(model_path):
        return export_info(Path(model_path), json_path)
    json_out = plan_outputs((json_path, "json", False, "--json"), inputs=[model_input(model_path)])[0]
    model = load(model_path)
    facts, c = model_info(model, model_path), model.config
    if json_out:
        write_json(json_out, facts)
    if json_out == STDOUT:
        return
    options = ", ".join(k for k, v in facts["options"].items() if v) or "none"
    per_layer = ", ".join(f"{k} {'x'.join(map(str, s))} {facts['decode_state_roles'][k]}"
                          for k, s in facts["decode_state_tensors"].items())
    click.echo("\n".join([
        f"{facts['path']}: {c.family}, form {c.form}",
        f"  vocab {c.vocab_size}, hidden {c.hidden_size}, {c.num_hidden_layers} layers, " + c.size_line(),
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


def export_info(directory: Path, json_path) -> None:
    """`info` of an export: what its manifest says of the model, and its files' bytes on disk."""
    from edgettt.outputs import STDOUT, plan_outputs, write_json
    from edgettt.runner import export_facts

    json_out = plan_outputs((json_path, "json", False, "--json"), inputs=[directory])[0]
    facts = export_facts(directory)
    if json_out:
        write_json(json_out, facts)
    if json_out == STDOUT:
        return
    bits = 8 * facts["weights_bytes"] / facts["parameters"] if facts["parameters"] else float("nan")
    click.echo("\n".join([
        f"{directory}: an export of {facts['model']} ({facts['family']}, form {facts['form']}), opset {facts['opset']}",
        f"  vocab {facts['vocab_size']}; tokenizer: {facts['tokenizer']}; activations {facts['activations']}",
        "  files: " + ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in facts["files_bytes"].items())
        + f" ({facts['weights_bytes'] / 1e6:.2f} MB, {bits:.2f} bits per weight)"
        + (f"; quantized: {quantization_line(facts['quantization'])}" if facts["quantization"] else ""),
        f"  decode state: {facts['decode_state_bytes_per_sequence']:,} bytes per sequence ("
        + ", ".join(f"{role} {n:,}" for role, n in facts["decode_state_bytes_by_role"].items()) + ")",
    ]))


def never_commit_line(weights: list[float] | None, b: int | None) -> list[str]:
    """A line naming the layers whose commit weight is 0: they never carry anything past a mini-batch."""
    idle = [str(i + 1) for i, w in enumerate(weights or []) if w <= 0]
    if not idle:
        return []
    many = len(idle) > 1
    return [f"  layer{'s' if many else ''} {', '.join(idle)} of {len(weights)} never commit{'' if many else 's'} "
            f"(commit weight 0): {'each' if many else 'it'} mixes only within its mini-batch of {b} tokens, "
            "remembering nothing past it"]


def decay_line(gammas: list[list[float]]) -> str:
    flat = sorted(g for layer in gammas for g in layer)
    lo, mid, hi = flat[0], flat[len(flat) // 2], flat[-1]
    line = f"  state decay: gamma a mini-batch {lo:.4f} / {mid:.4f} / {hi:.4f} (min / median / max"
    if not 0 < mid < 1:  # (no half-life to give)
        return line + ")"
    return (line + f" of {len(flat)} heads): what a head has learned fades to half in "
            f"{math.log(0.5) / math.log(mid):.0f} mini-batches (median)")


@cli.command("export", short_help="ONNX graphs, verified in onnxruntime")
@torch_threads
@click.argument("model_path", metavar="MODEL")
@click.argument("out", type=click.Path())
@click.option("--opset", default=21, show_default=True, type=click.IntRange(21, 23), help="ONNX opset.")
@click.option("--data", "verify_data", default="python-docs-sample", show_default=True, metavar="TEXT",
              help="Text the graphs are verified on against torch.")
@click.option("--no-verify", is_flag=True, help="Skip the verification.")
@click.option("--activations", type=click.Choice(["int8", "float"]), default="int8", show_default=True,
              help="int8: quantized layers multiply in integers where faster (--web: float).")
@click.option("--web", is_flag=True, help="Also a page that runs OUT in a browser (MODEL may be an export).")
@click.option("--force", is_flag=True, help="Overwrite OUT.")
def export_cmd(model_path, out, opset, verify_data, no_verify, activations, web, force):
    """Export a parallel-form (or LaCT) model, float or quantized, for ONNX Runtime: OUT/prefill.onnx,
    OUT/decode.onnx, one OUT/weights.bin, OUT/manifest.json; with a float state also what onnxruntime-genai
    opens. Both graphs are verified in onnxruntime against torch before anything is written. The graphs,
    their operators and the checks: docs/export.md."""
    from edgettt import load
    from edgettt.data import read_text
    from edgettt.checkpoint import stored_config
    from edgettt.onnx import default_activations, export_model, export_refusal
    from edgettt.onnx_files import WEIGHTS_FILE, graph_bytes
    from edgettt.outputs import Output
    from edgettt.runner import is_export

    if is_export(model_path) and not web:
        raise EdgetttError(f"{model_path}: already an export; add --web to make a browser folder of it, or give a "
                           "model directory")
    out = Output.plan(out, "export", force, inputs=[model_input(model_path), text_input(verify_data)])
    runtime = web_runtime() if web else None  # downloaded (or found in the cache) before any work
    if is_export(model_path):
        from edgettt.web import copy_export
        data = copy_export(model_path, out, runtime)
        click.echo(f"wrote {out.path}: {model_path} with {web_line(data)}")
        return
    config = stored_config(model_path)  # the form, before the weights are read
    refusal = export_refusal(config) if config is not None else None
    if refusal:
        raise EdgetttError(f"{model_path}: {refusal}")
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
    from edgettt.web import runtime_files
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


@cli.command("run", short_help="generate with onnxruntime and numpy only (no torch)")
@click.argument("export_dir", metavar="EXPORT", type=click.Path())
@click.option("--prompt", default=None, help="Text to continue (after --load-state: continuing it).")
@click.option("--max-new-tokens", default=64, show_default=True, type=COUNT, help="Tokens to generate.")
@click.option("--temperature", default=0.0, show_default=True, type=FiniteFloat(min=0), help="0: greedy.")
@click.option("--repetition-penalty", default=1.1, show_default=True, type=FiniteFloat(min=1),
              help="llama.cpp's over the last 64 tokens; 1: off.")
@click.option("--sampling", default="", type=SamplingSpec(), metavar="SETTINGS",
              help="top-k=K,top-p=P,seed=N.")
@click.option("--stop", multiple=True, metavar="TEXT", help="End when the output ends with TEXT.")
@click.option("--load-state", default=None, type=click.Path(), metavar="FILE", help="Continue a saved state.")
@click.option("--save-state", default=None, type=click.Path(), metavar="FILE", help="Save the state at the end.")
@click.option("--chat", is_flag=True, help="Then reply to turns read from stdin, a line each, in one state.")
@click.option("--threads", default=None, type=click.IntRange(1, 1024), help="onnxruntime threads.")
@click.option("--json", "json_path", default=None, type=click.Path(), metavar="PATH",
              help="Write the timings as JSON ('-': standard output).")
@click.option("--force", is_flag=True, help="Overwrite the --json and --save-state files.")
def run_cmd(export_dir, prompt, max_new_tokens, temperature, repetition_penalty, sampling, stop, load_state,
            save_state, chat, threads, json_path, force):
    """Generate from an export with onnxruntime and numpy only (no torch): prefill the prompt, decode token by
    token, streaming the text; tokens/s and peak memory at the end. Sampling, state files and chat:
    docs/cli.md."""
    from edgettt.outputs import plan_outputs, write_json
    from edgettt.runner import Runner, Sampling, peak_memory_mb

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
        write_json(json_out, stats)


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


@cli.command(short_help="models side by side: text, 4-bit drift, state, CPU speed")
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@click.argument("output", metavar="OUT", type=click.Path())
@click.option("--force", is_flag=True, help="Overwrite OUT.")
def compare(paths, output, force):
    """Each model's held-out bits per byte at 512/2048/8192 tokens, int8/int4/mixed weight drift, state formats'
    bytes and drift, and CPU decode tokens/s through its int4 export, in one table and page (OUT/compare.html).
    PATH: a model (the shipped tiny models unless one is given), an onnxruntime-genai folder (a same-size Llama
    timed beside them) or an `edgettt bench --device cuda --json` file (its decode rows shown). docs/compare.md."""
    from edgettt.api import compare as compare_models
    from edgettt.benchmark.plan import is_genai
    from edgettt.comparison import DEFAULT_MODELS, terminal
    from edgettt.outputs import Output

    llamas = [p for p in paths if Path(p).is_dir() and is_genai(p)]
    bench_files = [p for p in paths if Path(p).suffix == ".json"]
    models = [p for p in paths if p not in llamas + bench_files] or list(DEFAULT_MODELS)
    Output.plan(output, "compare", force, inputs=[*(model_input(m) for m in models), *llamas, *bench_files])
    if len(llamas) > 1 or len(bench_files) > 1:
        raise EdgetttError(f"{output}: compare takes one onnxruntime-genai folder and one bench file at most, got "
                           f"{len(llamas)} and {len(bench_files)}; give one of each")
    for model in models:
        check_comparable_model(model)
    for file in bench_files:
        check_bench_file(file)
    result = compare_models(models, output, llama=(llamas or [None])[0], gpu_bench=(bench_files or [None])[0],
                            force=force, log=click.echo)
    click.echo(terminal(result.data))
    click.echo(f"wrote {output}/compare.json, compare.md, compare.html")


def check_comparable_model(model_path) -> None:
    """Before any work: a float model (config.json read) of a form that exports (its speed is measured)."""
    from edgettt.checkpoint import stored_config
    from edgettt.onnx import export_refusal

    config = stored_config(model_path)
    if config is None:
        raise EdgetttError(f"{model_path}: no config.json; compare takes model directories, shipped names, an "
                           "onnxruntime-genai folder and an `edgettt bench --json` file")
    check_unquantized(model_path, "compare")
    refusal = export_refusal(config)
    if refusal:
        raise EdgetttError(f"{model_path}: {refusal}")


def check_bench_file(path) -> None:
    try:
        data = json.loads(Path(path).read_text())
        rows = data.get("result", data)["rows"]
        assert all({"path", "test", "tokens_per_s"} <= set(r) for r in rows)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, AssertionError):
        raise EdgetttError(f"{path}: not the JSON of `edgettt bench --json` (rows of path, test, "
                           "tokens_per_s); write one with `edgettt bench MODEL... --device cuda --json FILE`") from None


@cli.command(short_help="tokens/s of exports or models, llama-bench style")
@click.argument("paths", nargs=-1, metavar="PATH...")
@click.option("--pp", default="512", show_default=True, callback=int_list, help="Prefill lengths.")
@click.option("--tg", default="128", show_default=True, callback=int_list, help="Decoded tokens.")
@click.option("--depth", default="0", show_default=True, callback=count_list, help="Tokens of context before decode.")
@click.option("-r", "--repetitions", default=5, show_default=True, type=POSITIVE)
@click.option("--threads", default=None, type=POSITIVE, help="Each worker's threads [default: their own].")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Of the random token ids.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: models as `edgettt.prepare` makes them.")
@click.option("--batch", default=1, show_default=True, type=POSITIVE, help="Sequences at once.")
@click.option("--json", "json_path", default=None, type=click.Path(), metavar="PATH",
              help="Every row as JSON ('-': standard output).")
@click.option("--markdown", "md_path", default=None, type=click.Path(), metavar="PATH", help="The table.")
@click.option("--force", is_flag=True, help="Overwrite the output files.")
def bench(paths, pp, tg, depth, repetitions, threads, seed, device, batch, json_path, md_path, force):
    """Tokens a second each PATH prefills (ppN) and decodes (tgN@dD: N tokens after D of context), in the manner
    of llama-bench: the paths in turns, medians, peak memory. PATH: an export (the CPU runner), a model (torch),
    an onnxruntime-genai folder or genai:EXPORT, llama:<preset> with --device cuda. docs/performance.md."""
    from edgettt.benchmark import run, table, tests, write
    from edgettt.outputs import STDOUT, plan_outputs

    json_out, md_out = plan_outputs((json_path, "json", force, "--json"), (md_path, "markdown", force, "--markdown"),
                                    inputs=[model_input(p) for p in paths if not p.startswith("llama:")])
    result = run(list(paths), tests(pp, tg, depth), repetitions, threads, seed, device, batch,
                 partial=lambda so_far: write(so_far, json_out, md_out, final=False))  # after every repetition
    if json_out != STDOUT:
        click.echo(table(result))
    write(result, json_out, md_out)


def main():
    cli(prog_name="edgettt")
