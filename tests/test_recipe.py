"""The training recipe (recipes/train_tiny.py) runs end to end on the CPU: a few steps, the files it writes."""

import functools
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import edgettt
from conftest import schedules, stored_dtypes
from edgettt.data import read_text

RECIPE = Path(__file__).parent.parent / "recipes" / "train_tiny.py"


def write_parts(directory: Path) -> None:
    text = (b"def f(x):\n    return x + 1\n" * 200)
    for part in ("train", "docs_train", "val", "test"):
        (directory / f"{part}.bin").write_bytes(text)


@pytest.mark.parametrize("arch,weights", [("transformer", "transformer.safetensors"), ("ttt-linear", "model.safetensors"),
                                          ("lact-w1", "model.safetensors")])
def test_recipe_trains_and_writes_its_log_and_weights(tmp_path, arch, weights):
    write_parts(tmp_path)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(RECIPE), "--arch", arch, "--out", str(out), "--minutes", "30", "--steps", "3",
                    "--layers", "1", "--batch", "2", "--ctx", "64", "--data-dir", str(tmp_path)],
                   check=True, capture_output=True, timeout=300)
    log = json.loads((out / "train_log.json").read_text())
    assert log["arch"] == arch and log["steps"] == 3 and log["test_bits_per_byte"] > 0
    assert (out / weights).stat().st_size > 0
    if arch != "transformer":
        assert edgettt.load(out).config.num_hidden_layers == 1
    # a second schedule continues from the first's output (--init), the transformer's weights file too: with no
    # steps it scores what the first scored
    more = tmp_path / "more"
    subprocess.run([sys.executable, str(RECIPE), "--arch", arch, "--out", str(more), "--minutes", "30", "--steps", "0",
                    "--layers", "1", "--batch", "2", "--ctx", "64", "--data-dir", str(tmp_path), "--init", str(out)],
                   check=True, capture_output=True, timeout=300)
    continued = json.loads((more / "train_log.json").read_text())
    assert continued["steps"] == 0 and continued["continued_from"]["steps"] == 3
    assert continued["test_bits_per_byte"] == pytest.approx(log["test_bits_per_byte"], abs=1e-6)


def test_a_paused_schedule_resumed_trains_as_one_that_was_not(tmp_path):
    """--pause-after writes OUT.resume/ (before any best weights, with the best at the current step, and with an
    older best: its own file) and exits 75; --resume goes on with the same steps, data and learning rates: the
    same losses, validations and model as an uninterrupted run (within CPU float noise), the folder gone."""
    write_parts(tmp_path)
    recipe = load_recipe()

    def train(out, *more):  # in this process: the recipe's main, its exit status (0 when it returns)
        try:
            recipe.main(["--arch", "gated-deltanet", "--out", str(out), "--minutes", "30", "--steps", "5", "--layers",
                         "1", "--hidden", "64", "--batch", "2", "--ctx", "64", "--data-dir", str(tmp_path),
                         "--eval-every", "2", *more])
        except SystemExit as exit_:
            return exit_.code
        return 0

    assert train(tmp_path / "whole") == 0
    paused, written = tmp_path / "paused", []
    for resume in ([], ["--resume"], ["--resume"]):
        assert train(paused, "--pause-after", "0", *resume) == recipe.PAUSED
        written.append(sorted(f.name for f in (tmp_path / "paused.resume").iterdir()))
    assert "best.safetensors" not in written[1] and "best.safetensors" in written[2]  # steps 2 (best) and 3
    assert train(paused, "--resume") == 0 and not (tmp_path / "paused.resume").exists()
    whole, resumed = (json.loads((tmp_path / name / "train_log.json").read_text()) for name in ("whole", "paused"))
    assert resumed["steps"] == whole["steps"] == 5 and resumed["kept_step"] == whole["kept_step"]
    for key in ("loss", "val_bits_per_byte"):
        assert [e.get(key) for e in resumed["log"]] == pytest.approx([e.get(key) for e in whole["log"]], rel=1e-4)
    assert resumed["test_bits_per_byte"] == pytest.approx(whole["test_bits_per_byte"], rel=1e-4)
    assert train(tmp_path / "nothing", "--resume") == 2  # argparse's error: nothing to resume
    assert train(paused, "--pause-after", "0") == recipe.PAUSED
    with pytest.raises(SystemExit) as refused:  # another arch's command on this pause: refused before any work
        recipe.main(["--arch", "transformer", "--out", str(paused), "--resume", "--data-dir", str(tmp_path)])
    assert refused.value.code == 2


def load_recipe():
    spec = importlib.util.spec_from_file_location("train_tiny", RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


@pytest.mark.parametrize("arch,writers", [("ttt-linear", 1 + 2 * 2), ("ttt-mlp", 1 + 3 * 2), ("transformer", 1 + 2 * 2)])
def test_dropout_hooks_every_residual_writer_once_and_only_in_training(arch, writers):
    """--dropout: the embedding and each branch's output (TTT-MLP's PreConv once, not also its inner conv);
    evaluation sees the model unchanged."""
    recipe = load_recipe()
    model, _ = recipe.build(arch, 2, 0, {"hidden_size": 64, "intermediate_size": 96})
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    logits = lambda: getattr(out := model(ids), "logits", out)  # noqa: E731
    model.eval()
    before = logits()
    assert recipe.add_dropout(model, 0.5) == writers
    assert torch.equal(logits(), before)
    model.train()
    assert not torch.allclose(logits(), before, atol=1e-3)


def test_early_stopping_keeps_the_weights_of_the_best_validation_score():
    recipe = load_recipe()
    model, best = torch.nn.Linear(2, 2), recipe.BestWeights()
    snapshots = {}
    for step, val in [(100, 3.0), (200, 2.0), (300, 2.5)]:
        with torch.no_grad():
            model.weight.fill_(step)  # stands for training between evaluations
        snapshots[step] = model.weight.clone()
        best.offer(model, val, step)
    assert best.restore(model, last_val=2.7, last_step=350) == (2.0, 200)
    assert torch.equal(model.weight, snapshots[200])
    with torch.no_grad():
        model.weight.fill_(7.0)
    assert best.restore(model, last_val=1.5, last_step=400) == (1.5, 400)  # the last ones win: kept
    assert (model.weight == 7.0).all()


def test_validation_runs_at_every_eval_step_not_only_on_log_lines(tmp_path):
    """--eval-every 30: val is measured at steps 30, 60, 90, ... (it was checked only every 100 steps).
    A step budget, not a time budget: a loaded machine makes fewer steps in the same minutes."""
    write_parts(tmp_path)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(RECIPE), "--arch", "transformer", "--out", str(out), "--minutes", "30",
                    "--steps", "90",
                    "--layers", "1", "--batch", "2", "--ctx", "64", "--data-dir", str(tmp_path), "--eval-every", "30"],
                   check=True, capture_output=True, timeout=300)
    log = json.loads((out / "train_log.json").read_text())
    evaluated = [e["step"] for e in log["log"] if "val_bits_per_byte" in e]
    assert log["steps"] == 90
    assert evaluated == [30, 60, 90]


def test_sizes_and_a_bfloat16_file_for_larger_embedded_models(tmp_path):
    """Issue 23 item 3's knobs: other widths, and weights stored in bfloat16 that load as float32."""
    write_parts(tmp_path)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(RECIPE), "--arch", "ttt-linear", "--out", str(out), "--minutes", "30",
                    "--steps", "2", "--layers", "1", "--hidden", "64", "--intermediate", "96", "--store", "bfloat16", "--dropout", "0.1",
                    "--batch", "2", "--ctx", "64", "--data-dir", str(tmp_path)], check=True, capture_output=True,
                   timeout=300)
    assert stored_dtypes(out) == {"BF16"}
    assert json.loads((out / "train_log.json").read_text())["dropout"] == 0.1
    model = edgettt.load(out)
    assert (model.config.hidden_size, model.config.intermediate_size) == (64, 96)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    # the baseline transformer's weights file the same way: matrices in bfloat16, its norms' vectors float32
    baseline = tmp_path / "baseline"
    subprocess.run([sys.executable, str(RECIPE), "--arch", "transformer", "--out", str(baseline), "--minutes", "30",
                    "--steps", "1", "--layers", "1", "--store", "bfloat16", "--batch", "2", "--ctx", "64",
                    "--data-dir", str(tmp_path)], check=True, capture_output=True, timeout=300)
    weights = baseline / "transformer.safetensors"
    assert stored_dtypes(weights) == {"BF16"} and stored_dtypes(weights, matrices=False) == {"F32"}


def test_average_models_interpolates_every_weight_and_refuses_what_it_cannot_average(tmp_path):
    """recipes/average_models.py: (1 - t) a + t b in every floating tensor (t = 0 gives a back exactly),
    the larger distilled_ctx kept; models of different configs, a weight outside 0..1 and an output that
    is an input are refused with one line and a non-zero exit, nothing written."""
    spec = importlib.util.spec_from_file_location("average_models", RECIPE.parent / "average_models.py")
    avg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(avg)
    a, b = edgettt.load("ttt-linear-tiny-parallel"), edgettt.load("ttt-linear-tiny-parallel")
    with torch.no_grad():
        for p in b.parameters():
            p.add_(1.0)
    b.config.extra["distilled_ctx"] = 99999
    mixed = avg.average(a, b, 0.25)
    name, wa = next(iter(a.state_dict().items()))
    assert torch.allclose(mixed.state_dict()[name], wa + 0.25, atol=1e-6)
    assert mixed.config.extra["distilled_ctx"] == 99999
    assert all(torch.equal(x, y) for x, y in zip(avg.average(a, b, 0).state_dict().values(), a.state_dict().values()))
    edgettt.save(a, tmp_path / "a")
    assert avg.main([str(tmp_path / "a"), "ttt-linear-tiny-parallel", str(tmp_path / "out"), "--t", "0.5"]) == 0
    assert (tmp_path / "out" / "config.json").exists() and stored_dtypes(tmp_path / "out") == {"F32"}
    assert avg.main([str(tmp_path / "a"), "ttt-linear-tiny-parallel", str(tmp_path / "half"), "--t", "0.5",
                     "--store", "bfloat16"]) == 0
    assert stored_dtypes(tmp_path / "half") == {"BF16"}
    bad = [([str(tmp_path / "a"), "ttt-mlp-tiny-parallel", str(tmp_path / "x"), "--t", "0.5"], 1),
           ([str(tmp_path / "a"), str(tmp_path / "a"), str(tmp_path / "x"), "--t", "1.5"], 2),
           ([str(tmp_path / "a"), str(tmp_path / "out"), str(tmp_path / "a"), "--t", "0.5", "--force"], 2),
           ([str(tmp_path / "a"), str(tmp_path / "a"), str(tmp_path / "out"), "--t", "0.5"], 1)]  # out exists, no --force
    for args, code in bad:
        result = subprocess.run([sys.executable, str(RECIPE.parent / "average_models.py"), *args], capture_output=True,
                                text=True)
        assert result.returncode == code and "Traceback" not in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()[-1]) > 0
    assert not (tmp_path / "x").exists()


def test_eval_card_measures_a_shipped_models_eval_json_again(tmp_path, capsys):
    """recipes/eval_card.py gives lact-w1-tiny's committed numbers (whole test part and slice, at 512) with the
    commands that measure them; an existing OUT without --force and a length that is no number are refused in
    one line, nothing written."""
    spec = importlib.util.spec_from_file_location("eval_card", RECIPE.parent / "eval_card.py")
    eval_card = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_card)
    out = tmp_path / "eval.json"
    assert eval_card.main(["lact-w1-tiny", str(out), "--note", "trained on the fixed split"]) == 0
    made = json.loads(out.read_text())
    committed = json.loads((edgettt.checkpoint.SHIPPED_MODELS / "lact-w1-tiny" / "eval.json").read_text())
    for key in ("test_bits_per_byte", "slice_bits_per_byte"):
        assert made[key] == pytest.approx(committed[key], rel=1e-5), key
    assert {k: made[k] for k in ("slice", "text", "held_out")} == {k: committed[k] for k in ("slice", "text", "held_out")}
    assert made["commands"]["slice"] == "edgettt eval lact-w1-tiny --data python-docs:test --ctx 512 --max-tokens 8192"
    for args in (["lact-w1-tiny", str(out), "--note", "x"], ["lact-w1-tiny", str(tmp_path / "y.json"), "--note", "x",
                                                               "--ctx", "512,long"]):
        capsys.readouterr()
        assert eval_card.main(args) == 1
        assert capsys.readouterr().err.startswith("error: ")
    assert json.loads(out.read_text()) == made and not (tmp_path / "y.json").exists()


def test_mixed_distill_saves_the_student_in_bfloat16_and_measures_what_it_saved(tmp_path):
    """benchmarks/mixed_distill.py --save --store bfloat16: the student's matrices stored in bfloat16, and
    the "after" numbers are the saved model's (loaded back), not the float32 one's in memory."""
    script = RECIPE.parent.parent / "benchmarks" / "mixed_distill.py"
    out, report = tmp_path / "student", tmp_path / "report.json"
    subprocess.run([sys.executable, str(script), "--teacher", "ttt-mlp-tiny", "--student", "ttt-mlp-tiny-parallel",
                    "--lengths", "64", "--steps", "1", "--lr", "1e-6", "--max-tokens", "256", "--data",
                    "python-docs-sample", "--save", str(out), "--store", "bfloat16", "--json", str(report)],
                   check=True, capture_output=True, timeout=600)
    assert stored_dtypes(out) == {"BF16"}
    result = json.loads(report.read_text())
    saved = edgettt.evaluate(edgettt.load(out), read_text("python-docs:test"), ctx=[64], max_tokens=256)[0]
    assert result["after"]["64"] == pytest.approx(saved.bits_per_byte, abs=1e-6)


TRAIN_ALL = RECIPE.parent / "train_all.sh"
RECORDS = RECIPE.parent / "results" / "distill"
# the committed records (mixed_distill.py's JSON) of each shipped parallel form's distillation stages, in order
DISTILL_RECORDS = {"ttt-linear": [f"ttt-linear-tiny-parallel.stage{i}" for i in (1, 2, 3)],
                   "ttt-mlp": [f"ttt-mlp-tiny-parallel.stage{i}" for i in (1, 2, 3, 4)]}


@functools.cache
def train_all_commands() -> list[list[str]]:
    """recipes/train_all.sh's commands, one argument list each (DRY=1 prints them and runs nothing)."""
    done = subprocess.run(["bash", str(TRAIN_ALL)], env=dict(os.environ, DRY="1", WORK="/w", DATA="/d"),
                          cwd=RECIPE.parent.parent, capture_output=True, text=True, check=True, timeout=60)
    return [shlex.split(line) for line in done.stdout.splitlines()]


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("arch, log", [("ttt-linear", "ttt-linear-tiny"), ("ttt-mlp", "ttt-mlp-tiny"),
                                       ("transformer", "transformer-baseline"),
                                       ("gated-deltanet", "gated-deltanet-tiny")])
def test_train_all_makes_the_schedules_of_the_shipped_logs(arch, log):
    """Each schedule train_all.sh runs has the steps, rate, docs weight, compile flag and dropout of the committed
    log's schedules (the shipped runs'), at the larger size, each continuing the one before."""
    runs = [a for a in train_all_commands() if a[1:2] == ["recipes/train_tiny.py"] and option(a, "--arch") == arch]
    logged = schedules(json.loads((RECIPE.parent / "results" / f"{log}.train_log.json").read_text()))
    assert [(int(option(a, "--steps")), float(option(a, "--lr")), float(option(a, "--docs-weight") or 0),
             "--compile" in a, float(option(a, "--dropout"))) for a in runs] == \
        [(s["steps"], s["lr"], s["docs_weight"], s["compiled"], s["dropout"]) for s in logged]
    assert all(option(a, "--hidden") == "256" and option(a, "--layers") == "5" for a in runs)
    assert [option(a, "--init") for a in runs[1:]] == [option(a, "--out") for a in runs[:-1]]


@pytest.mark.parametrize("arch", DISTILL_RECORDS)
def test_train_all_distils_as_the_shipped_parallel_forms_were(arch):
    """Each mixed_distill.py stage of train_all.sh has the options and steps of the committed record of that
    stage of the shipped model (steps_run: the runs were on the clock, the recipe gives their steps)."""
    runs = [a for a in train_all_commands() if a[1:2] == ["benchmarks/mixed_distill.py"]
            and option(a, "--teacher") == f"/w/{arch}"]
    assert len(runs) == len(DISTILL_RECORDS[arch])
    for args, name in zip(runs, DISTILL_RECORDS[arch]):
        record = json.loads((RECORDS / f"{name}.json").read_text())
        made = record["args"]
        assert int(option(args, "--steps")) == record["steps_run"], name
        assert float(option(args, "--lr")) == made["lr"] and int(option(args, "--batch")) == made["batch"], name
        assert option(args, "--lengths") == made["lengths"], name
        assert int(option(args, "--pool") or 0) == made["pool"], name
        assert float(option(args, "--hard-weight") or 0) == made["hard_weight"], name
        assert (option(args, "--decay") and float(option(args, "--decay"))) == made["decay"], name
        assert Path(option(args, "--data")).name == Path(made["data"]).name, name
    assert [option(a, "--student") for a in runs[1:]] == [option(a, "--save") for a in runs[:-1]]
