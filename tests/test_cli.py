"""The command line through click's runner: the main job, and every bad input of the foundation issue."""

import json
import subprocess
import sys

import click
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from edgettt import load
from edgettt.cli import cli


def run(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "ttt"
    result = run("create", path, "--family", "mlp", "--set", "hidden_size=32", "--set", "share_qk=true", "--set", "pre_conv=true",
                 "--set", "use_gate=true", "--set", "mini_batch_size=8")
    assert result.exit_code == 0, result.output
    return path


def test_convert_exact_reports_error_against_the_original(ckpt, tmp_path):
    result = run("convert", ckpt, tmp_path / "out", "--form", "exact", "--max-tokens", "600", "--ctx", "100")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "convert_report.json").read_text())
    assert report["form"] == "exact" and report["rel_error"] < 1e-5 and report["windows"] == 6
    assert "relative error" in result.output
    assert load(tmp_path / "out").form == "exact"


def test_convert_parallel_reports_drift(ckpt, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 20)
    result = run("convert", ckpt, tmp_path / "out", "--form", "parallel", "--data", text, "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["text"]["bytes"] == len(text.read_bytes())
    for key in ("kld_mean", "kld_median", "kld_p99", "kld_max", "top1"):
        assert key in report
    assert report["ref"]["ppl"] > 1 and report["model"]["ppl"] > 1 and 0 <= report["top1"] <= 1


def test_the_api_behind_convert_and_quantize_writes_what_the_commands_write(ckpt, tmp_path):
    """`api.convert_checkpoint` and `api.quantize_checkpoint`, which the commands call: the same files and
    report as the command line, an output replaced only with force=True."""
    from edgettt.api import convert_checkpoint, quantize_checkpoint
    from edgettt.errors import EdgetttError
    from edgettt.quant.config import QuantConfig

    assert run("convert", ckpt, tmp_path / "cli", "--form", "parallel", "--max-tokens", "300").exit_code == 0
    done = convert_checkpoint(ckpt, tmp_path / "api", "parallel", max_tokens=300)
    cli_report = json.loads((tmp_path / "cli" / "convert_report.json").read_text())
    assert json.loads((tmp_path / "api" / "convert_report.json").read_text()) == done.report
    assert {k: v for k, v in done.report.items() if k != "source"} == \
        {k: v for k, v in cli_report.items() if k != "source"}
    assert load_file(tmp_path / "api" / "model.safetensors").keys() == load_file(tmp_path / "cli" / "model.safetensors").keys()
    with pytest.raises(EdgetttError, match="force=True"):
        convert_checkpoint(ckpt, tmp_path / "api", "parallel", measure=False)
    q = quantize_checkpoint(tmp_path / "api", tmp_path / "q8", QuantConfig("int8"))
    assert q.path == tmp_path / "q8" and load(q.path).config.quantization["variant"] == "int8"
    assert q.after["size_mb"] < q.before["size_mb"] and len(q.rows) > 0


def test_convert_reads_stdin(ckpt, tmp_path):
    result = run("convert", ckpt, tmp_path / "out", "--data", "-", "--json", "-", input="hello world, " * 30)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["text"]["name"] == "<stdin>"


def test_info(ckpt, tmp_path):
    result = run("info", ckpt, "--json", "-")
    assert result.exit_code == 0, result.output
    facts = json.loads(result.output)
    model = load(ckpt)
    assert facts["family"] == "ttt-mlp" and facts["form"] == "ttt"
    assert facts["parameters"] == sum(p.numel() for p in model.parameters())
    H, d, K = 4, 8, 4  # per layer: W1, GW1 [d, 4d]; b1, Gb1 [1, 4d]; W2, GW2 [4d, d]; b2, Gb2 [1, d]; 2 conv tails
    per_layer = 2 * H * (d * 4 * d + 4 * d + 4 * d * d + d) + 2 * (K - 1) * 32
    assert facts["decode_state_bytes_per_sequence"] == 2 * per_layer * 4
    assert "decode state" in run("info", ckpt).output


def test_existing_output_needs_force(ckpt, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run("convert", ckpt, out, "--no-report")
    assert result.exit_code == 1 and "already exists; pass --force" in result.output
    assert (out / "keep.txt").read_text() == "mine"
    result = run("convert", ckpt, out, "--no-report", "--force")  # a folder of the user's: never replaced
    assert result.exit_code == 1 and "refusing to replace it even with --force" in result.output
    assert (out / "keep.txt").read_text() == "mine"
    mine = tmp_path / "model"
    assert run("convert", ckpt, mine, "--no-report", "--form", "parallel").exit_code == 0
    assert run("convert", ckpt, mine, "--no-report", "--force").exit_code == 0  # what edgettt wrote: replaced
    assert load(mine).form == "exact"


def spoil_weights(src, dst, change):
    import shutil

    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    change(weights)
    save_file(weights, dst / "model.safetensors")
    return dst


BAD = {
    "missing dir": (lambda c, t: t / "nowhere", "no such directory"),
    "not a dir": (lambda c, t: (t / "f").write_text("x") and t / "f", "not a directory"),
    "wrong model_type": (lambda c, t: spoil_config(c, t / "b", model_type="mamba"), "model_type is 'mamba'"),
    "inconsistent sizes": (lambda c, t: spoil_config(c, t / "b", hidden_size=30), "not divisible"),
    "missing tensor": (lambda c, t: spoil_weights(c, t / "b", lambda w: w.pop("model.norm.weight")),
                       "missing tensors: model.norm.weight"),
    "extra tensor": (lambda c, t: spoil_weights(c, t / "b", lambda w: w.update(junk=torch.ones(1))),
                     "unexpected tensors: junk"),
    "mis-shaped": (lambda c, t: spoil_weights(c, t / "b", lambda w: w.update(
        {"model.layers.0.ffn_norm.weight": torch.ones(3)})), "mis-shaped tensors: model.layers.0.ffn_norm.weight"),
    "non-finite": (lambda c, t: spoil_weights(c, t / "b", lambda w: w["model.norm.weight"].fill_(float("inf"))),
                   "non-finite values"),
}


def spoil_config(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    raw.update(changes)
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("command", ["convert", "info"])
def test_bad_input_is_one_line_nonzero_and_leaves_nothing(ckpt, tmp_path, case, command):
    make, message = BAD[case]
    src = make(ckpt, tmp_path)
    out = tmp_path / "out"
    args = ("convert", src, out) if command == "convert" else ("info", src)
    result = run(*args)
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temporary leftovers


def test_pickle_that_is_not_weights_only(tmp_path):
    assert run("create", tmp_path / "m", "--weights-format", "bin").exit_code == 0
    weights = torch.load(tmp_path / "m" / "pytorch_model.bin", weights_only=True)
    weights["code"] = print  # a pickled function: only a full unpickler would run such things
    torch.save(weights, tmp_path / "m" / "pytorch_model.bin")
    result = run("convert", tmp_path / "m", tmp_path / "out")
    assert result.exit_code == 1 and "not a weights-only pickle" in result.output
    assert not (tmp_path / "out").exists()


def test_empty_text_is_an_error(ckpt, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    result = run("convert", ckpt, tmp_path / "out", "--data", tmp_path / "empty.txt")
    assert result.exit_code == 1 and "the text is empty" in result.output
    assert not (tmp_path / "out").exists()


def test_small_vocabulary_without_tokenizer_needs_no_report(tmp_path):
    assert run("create", tmp_path / "m", "--set", "vocab_size=100").exit_code == 0
    result = run("convert", tmp_path / "m", tmp_path / "out")
    assert result.exit_code == 1 and "--no-report" in result.output
    assert run("convert", tmp_path / "m", tmp_path / "out", "--no-report").exit_code == 0


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "edgettt", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "convert" in result.stdout


def test_convert_with_distillation_reports_before_and_after(ckpt, tmp_path):
    text = tmp_path / "train.txt"
    text.write_text("for i in range(10):\n    print(i * i)\n" * 40)
    result = run("convert", ckpt, tmp_path / "out", "--form", "parallel", "--distill", "steps=3,batch=4",
                 "--data", text, "--eval-data", "python-docs-sample", "--max-tokens", "512", "--ctx", "64")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "convert_report.json").read_text())
    assert report["distill"]["steps"] == 3 and report["distill"]["train_text"]["name"] == str(text)
    assert report["distill"]["batch"] == 4 and report["distill"]["hard_weight"] == 0
    # the context it was distilled at travels in config.json, through quantize too
    assert json.loads((tmp_path / "out" / "config.json").read_text())["distilled_ctx"] == 64
    assert run("quantize", tmp_path / "out", tmp_path / "q", "--weights", "int8").exit_code == 0
    assert json.loads((tmp_path / "q" / "config.json").read_text())["distilled_ctx"] == 64
    assert report["distill"]["before"]["text"]["name"] == report["text"]["name"] == "python-docs-sample"
    assert report["kld_mean"] != report["distill"]["before"]["kld_mean"]  # the weights moved
    assert "before distillation" in result.output and "after 3 distillation steps" in result.output


def test_convert_distills_at_mixed_lengths(ckpt, tmp_path):
    """--distill ctx=16/48: both lengths in turn; config.json keeps the longest as the context it is good for."""
    result = run("convert", ckpt, tmp_path / "out", "--form", "parallel", "--distill", "steps=2,batch=1,ctx=16/48",
                 "--data", "python-docs-sample", "--no-report")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "convert_report.json").read_text())
    assert report["distill"]["ctx"] == [16, 48] and report["distill"]["steps"] == 2
    assert json.loads((tmp_path / "out" / "config.json").read_text())["distilled_ctx"] == 48


def test_info_names_the_layers_that_never_commit():
    """A layer whose mini-batch's last token weighs 0 never adds to its state: info says which (the shipped
    TTT-Linear's layer 2; its distilled parallel form's layers 2 and 5; TTT-MLP's 1, 3 and 4)."""
    result = run("info", "ttt-linear-tiny")
    assert result.exit_code == 0 and "layer 2 of 5 never commits (commit weight 0)" in result.output
    facts = json.loads(run("info", "ttt-linear-tiny", "--json", "-").output)
    assert facts["commit_weights"][1] == 0 and all(w > 0 for i, w in enumerate(facts["commit_weights"]) if i != 1)
    assert "layers 1, 3, 4 of 5 never commit" in run("info", "ttt-mlp-tiny").output
    assert "layers 2, 5 of 5 never commit" in run("info", "ttt-linear-tiny-parallel").output
    assert json.loads(run("info", "lact-tiny", "--json", "-").output)["commit_weights"] is None


def test_convert_decay_distills_each_heads_gamma_and_info_shows_them(ckpt, tmp_path):
    """--decay 0.9: a decayed parallel form; the distillation tunes each head's gamma; info lists them."""
    result = run("convert", ckpt, tmp_path / "out", "--form", "parallel", "--decay", "0.9", "--distill",
                 "steps=3,batch=1,lr=0.05,ctx=48", "--data", "python-docs-sample", "--no-report")
    assert result.exit_code == 0, result.output
    assert "decayed (gamma 0.9 a mini-batch to start)" in result.output
    assert json.loads((tmp_path / "out" / "config.json").read_text())["state_decay"] is True
    facts = json.loads(run("info", tmp_path / "out", "--json", "-").output)
    gammas = [g for layer in facts["state_decay"] for g in layer]
    assert len(gammas) == facts["layers"] * facts["heads"] and all(0 < g < 1 for g in gammas)
    assert any(abs(g - 0.9) > 1e-4 for g in gammas)  # tuned: the gammas moved
    assert "state decay: gamma a mini-batch" in run("info", tmp_path / "out").output
    assert json.loads(run("info", ckpt, "--json", "-").output)["state_decay"] is None


def test_convert_distills_from_a_pool_of_the_originals_logits(ckpt, tmp_path):
    """--distill pool=2: the original runs 2 batches a length before the steps, then never again (its forwards counted)."""
    from edgettt.families.ttt.model import CausalLM

    calls = []
    forward = CausalLM.forward
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CausalLM, "forward", lambda self, *a, **k: calls.append(self.form) or forward(self, *a, **k))
        result = run("convert", ckpt, tmp_path / "out", "--form", "parallel", "--distill",
                     "steps=6,batch=1,ctx=16/48,pool=2", "--data", "python-docs-sample",
                     "--no-report")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "convert_report.json").read_text())
    assert report["distill"]["pool"] == 2 and report["distill"]["steps"] == 6
    assert calls.count("ttt") == 2 * 2  # 2 batches for each of the 2 lengths; 6 steps of the converted model
    assert calls.count("parallel") == 6


def test_one_distill_ctx_is_the_length_reported(ckpt, tmp_path):
    """--distill ctx=24 beside --ctx 64: the report and config.json both name 24, the length trained at."""
    result = run("convert", ckpt, tmp_path / "out", "--form", "parallel", "--distill", "steps=1,batch=1,ctx=24",
                 "--ctx", "64", "--data", "python-docs-sample", "--no-report")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "convert_report.json").read_text())
    assert report["distill"]["ctx"] == 24
    assert json.loads((tmp_path / "out" / "config.json").read_text())["distilled_ctx"] == 24


def test_convert_distillation_ends_on_the_clock_with_minutes(ckpt, tmp_path, monkeypatch):
    """--distill minutes=0.05 (3 s) on a fake clock that ticks 1 s a reading: 2 of the 50 steps asked."""
    clock = iter(range(1000))
    monkeypatch.setattr("edgettt.distill.time.monotonic", lambda: next(clock))
    result = run("convert", ckpt, tmp_path / "out", "--form", "parallel", "--distill", "steps=50,batch=2,minutes=0.05",
                 "--data", "python-docs-sample", "--max-tokens", "128", "--ctx", "32")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "convert_report.json").read_text())
    assert (report["distill"]["steps"], report["distill"]["steps_asked"], report["distill"]["minutes"]) == (2, 50, 0.05)
    assert "after 2 distillation steps" in result.output
    bad = run("convert", ckpt, tmp_path / "bad", "--form", "parallel", "--distill", "minutes=0")
    assert bad.exit_code != 0 and "minutes=0" in bad.output and not (tmp_path / "bad").exists()


def test_convert_refuses_a_hard_weight_outside_0_to_1(ckpt, tmp_path):
    result = run("convert", ckpt, tmp_path / "out", "--form", "parallel", "--distill", "hard_weight=1.5")
    assert result.exit_code != 0 and "hard_weight=1.5" in result.output and not (tmp_path / "out").exists()


def test_torch_threads_default_leaves_busy_cores_alone_and_the_option_sets_them():
    from edgettt.threads import default_torch_threads

    assert default_torch_threads(2, 1.0, 2) == 1  # another job on one of two cores
    assert default_torch_threads(2, 0.1, 2) == 2 and default_torch_threads(8, 0.0, 4) == 4
    assert default_torch_threads(2, 7.5, 2) == 1
    before = torch.get_num_threads()
    try:
        assert run("eval", "ttt-linear-tiny", "--ctx", "32", "--max-tokens", "64", "--threads", "1").exit_code == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_busy_cores_counts_the_cpu_time_not_idle_now():
    """The default thread count's idea of busy cores: /proc/stat's first line, iowait counted idle (the
    1-minute load average lags a run that just ended: the next command took one thread of two)."""
    from edgettt.threads import busy_cores, idle_and_total

    line = "cpu  100 5 20 800 50 3 2 0 40 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
    assert idle_and_total(line) == (850, 980)  # guest (40) is inside user: not added again
    busy = busy_cores(2, interval=0.01)
    assert 0.0 <= busy <= 2.0


def test_info_shows_the_distilled_context():
    facts = json.loads(run("info", "ttt-linear-tiny-parallel", "--json", "-").output)
    assert facts["distilled_ctx"] == 8192
    assert "distilled at 8192 tokens" in run("info", "ttt-linear-tiny-parallel").output
    assert json.loads(run("info", "ttt-linear-tiny", "--json", "-").output)["distilled_ctx"] is None


def test_create_preset_builds_the_published_size_with_any_backbone(tmp_path):
    """125m: hidden 768, 12 layers, 12 heads, intermediate 2048, vocabulary 32000 (ttt-lm-pytorch's
    TTT_STANDARD_CONFIGS with the Llama tokenizer's size); the backbone options still apply. The
    other presets' sizes are checked without building them."""
    from edgettt.families.ttt.config import PRESETS, ModelConfig

    result = run("create", tmp_path / "m", "--preset", "125m", "--family", "mlp", "--set", "share_qk=true", "--set", "pre_conv=true")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["intermediate_size"], config["vocab_size"]) == (768, 12, 12, 2048, 32000)
    assert config["share_qk"] and config["pre_conv"] and "random weights" in result.output
    assert f"{load(tmp_path / 'm').num_parameters():,} parameters" in result.output
    sizes = {name: ModelConfig(**p, vocab_size=32000).estimated_parameters() for name, p in PRESETS.items()}
    assert 0.8e8 < sizes["125m"] < sizes["350m"] < sizes["760m"] < sizes["1b"] < 1.6e9


def test_every_command_keeps_to_the_option_budget():
    """At most 12 options a command and 91 in all (hidden old spellings counted too; compare, the eleventh
    command, takes one): the surface a user
    learns stays small; a research switch belongs in the lab's scripts."""
    counts = {name: sum(isinstance(p, click.Option) and p.name != "help" for p in command.params)
              for name, command in cli.commands.items()}
    group = sum(isinstance(p, click.Option) and p.name not in ("help", "version") for p in cli.params)
    assert max(counts.values()) <= 12, counts
    assert sum(counts.values()) + group <= 91, counts


@pytest.mark.parametrize("args", [("convert", "a", "b", "--steps", "3"), ("calibrate", "a", "--seq-len", "8"),
                                  ("export", "a", "b", "--verify-data", "x")])
def test_an_option_edgettt_does_not_have_is_a_malformed_command_line(args):
    result = run(*args)
    assert result.exit_code == 2 and "No such option" in result.output


@pytest.mark.parametrize("command", [None, "create", "convert", "calibrate", "quantize", "report", "eval", "info",
                                     "export", "run", "bench"])
def test_every_help_fits_a_screen(command):
    """At 80 columns, 32 lines at most: the details are in docs/cli.md, which each help names."""
    result = CliRunner().invoke(cli, [*([command] if command else []), "--help"], terminal_width=80)
    assert result.exit_code == 0 and len(result.output.splitlines()) <= 32, result.output


def test_quantize_lists_its_formats_from_the_registries():
    from edgettt.formats.state_formats import STATE_FORMATS
    from edgettt.quant.weight_formats import WEIGHT_FORMATS

    listed = run("quantize", "--list").output
    for name, fmt in [*WEIGHT_FORMATS.items(), *STATE_FORMATS.items()]:
        assert f"{name} " in listed and fmt.summary in listed


def test_distill_settings_read_back_what_they_were_given():
    from edgettt.distill import DistillSettings

    s = DistillSettings.parse("steps=30, lr=3e-4,ctx=512/2048,hard-weight=0.3,pool=2,minutes=1.5,batch=4")
    assert s == DistillSettings(30, 3e-4, 4, (512, 2048), 1.5, 0.3, 2)
    assert DistillSettings.parse("") == DistillSettings() and DistillSettings(**{**s.to_dict(), "ctx": (512, 2048)}) == s
    for bad in ("steps", "steps=x", "ctx=512/", "speed=3", "lr=nan", "hard_weight=2", "pool=-1"):
        with pytest.raises(ValueError):
            DistillSettings.parse(bad)


def test_info_gives_the_bytes_as_stored_on_disk():
    """A shipped model's file holds bfloat16 matrices: info counts 16 bits a weight and the file's bytes
    (less its header), not the float32 it computes in."""
    from edgettt.checkpoint import SHIPPED_MODELS

    facts = json.loads(run("info", "ttt-linear-tiny", "--json", "-").output)
    file_bytes = (SHIPPED_MODELS / "ttt-linear-tiny" / "model.safetensors").stat().st_size
    assert 0 < file_bytes - facts["weights_bytes"] < 20_000
    assert 15.9 < facts["bits_per_weight"] < 16.2


def test_ctrl_c_exits_130_and_leaves_nothing_behind(ckpt, tmp_path, monkeypatch):
    """Interrupted while writing the model: exit 130, one line, no OUT and no staging folder beside it."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("edgettt.checkpoint.write_weights", interrupted)
    result = run("convert", ckpt, tmp_path / "out", "--no-report")
    assert result.exit_code == 130 and "interrupted: nothing was written or replaced" in result.output
    assert list(tmp_path.iterdir()) == []  # (staging folders are hidden names beside OUT)


def test_create_takes_a_tokenizer_and_its_vocabulary(tmp_path):
    """The tokenizer goes with the model; its size is the vocabulary unless one is set, and one larger
    than the vocabulary is refused before anything is written."""
    from conftest import word_tokenizer

    tok = word_tokenizer(tmp_path / "tok.json", 300)
    result = run("create", tmp_path / "m", "--tokenizer", tok)
    assert result.exit_code == 0, result.output
    model = load(tmp_path / "m")
    assert model.config.vocab_size == 300 and model.tokenizer.encode("w299 w1") == [299, 1]
    refused = run("create", tmp_path / "small", "--tokenizer", tok, "--set", "vocab_size=260")
    assert refused.exit_code == 1 and "300 tokens" in refused.output and not (tmp_path / "small").exists()


def test_a_large_vocabulary_with_the_byte_tokenizer_is_noted(tmp_path):
    result = run("create", tmp_path / "m", "--set", "vocab_size=1000")
    assert result.exit_code == 0 and "byte-level tokenizer" in result.output and "--tokenizer" in result.output


def test_a_large_drift_says_what_to_do():
    """A parallel form far from its original: one line with the drift, --distill and its estimated time."""
    from edgettt.cli import drift_note

    report = {"form": "parallel", "ppl_ratio": 4.1446, "windows": 16, "ctx": 256}
    note = drift_note(report, seconds=8.0)
    assert note.count("\n") == 0 and "314% above" in note and "--distill" in note and "--form exact" in note
    # 300 steps x 32 windows x 256 tokens x 4 forwards at 8 s / (2 x 16 x 256) tokens
    assert "an estimated 160 min" in note
    assert drift_note({**report, "ppl_ratio": 1.03}, 8.0) is None and drift_note({"form": "exact"}, 8.0) is None


def test_eval_and_info_give_one_size_as_stored(tmp_path):
    """A bfloat16 file: eval and info both count its bytes on disk, not the float32 it computes in."""
    facts = json.loads(run("info", "ttt-linear-tiny", "--json", "-").output)
    result = run("eval", "ttt-linear-tiny", "--data", "python-docs-sample", "--ctx", "64", "--max-tokens", "256",
                 "--json", tmp_path / "e.json")
    assert result.exit_code == 0, result.output
    model = json.loads((tmp_path / "e.json").read_text())["model"]
    assert round(model["size_mb"] * 1e6) == facts["weights_bytes"]
    assert model["bits_per_weight"] == pytest.approx(facts["bits_per_weight"])
