"""`edgettt eval` through click's runner: summaries, JSON, and saved reference logits."""

import json

import pytest
from click.testing import CliRunner

from edgettt.cli import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("m")
    assert run("create", root / "ttt", "--set", "hidden_size=32", "--set", "mini_batch_size=8").exit_code == 0
    assert run("convert", root / "ttt", root / "par", "--form", "parallel", "--no-report").exit_code == 0
    return root


def test_eval_alone_gives_perplexity_and_bits_per_byte(models, tmp_path):
    result = run("eval", models / "ttt", "--data", "python-docs-sample", "--ctx", "128", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["windows"] == (16384 - 1) // 128 and report["ctx"] == 128
    assert report["bits_per_byte"] > 0 and "Bits per byte" in result.output and "drift" not in report


def test_saved_reference_logits_give_the_same_drift_as_the_reference_model(models, tmp_path):
    common = ("--data", "python-docs-sample", "--ctx", "64", "--max-tokens", "1024")
    assert run("eval", models / "ttt", *common, "--save-logits", tmp_path / "ref.st").exit_code == 0
    live = run("eval", models / "par", "--ref", models / "ttt", *common, "--json", tmp_path / "a.json")
    saved = run("eval", models / "par", "--ref-logits", tmp_path / "ref.st", *common, "--json", tmp_path / "b.json")
    assert live.exit_code == 0 and saved.exit_code == 0, live.output + saved.output
    a, b = (json.loads((tmp_path / f).read_text())["drift"] for f in ("a.json", "b.json"))
    assert a["kld_mean"] == pytest.approx(b["kld_mean"], rel=1e-9) and a["kld_mean"] > 0
    assert a["top1"] == b["top1"] and len(a["kld_by_position"]) == 8
    assert "Mean    KLD" in saved.output and "Same top p" in saved.output


def test_reference_logits_from_another_text_are_refused(models, tmp_path):
    assert run("eval", models / "ttt", "--data", "python-docs-sample", "--max-tokens", "256",
               "--save-logits", tmp_path / "ref.st").exit_code == 0
    (tmp_path / "other.txt").write_text("something else entirely " * 20)
    result = run("eval", models / "par", "--ref-logits", tmp_path / "ref.st", "--data", tmp_path / "other.txt")
    assert result.exit_code == 1 and "reference logits were made on python-docs-sample" in result.output


def test_eval_bad_inputs(models, tmp_path):
    (tmp_path / "x.json").write_text("{}")
    result = run("eval", models / "ttt", "--json", tmp_path / "x.json")
    assert result.exit_code == 1 and "already exists; pass --force" in result.output
    result = run("eval", models / "ttt", "--ref-logits", tmp_path / "missing.st")
    assert result.exit_code == 1 and "no such file" in result.output
    (tmp_path / "junk.st").write_bytes(b"junk" * 10)
    result = run("eval", models / "ttt", "--ref-logits", tmp_path / "junk.st")
    assert result.exit_code == 1 and "not a reference-logits file" in result.output
    result = run("eval", models / "ttt", "--ref", models / "ttt", "--ref-logits", tmp_path / "junk.st")
    assert result.exit_code == 1 and "give one reference" in result.output


def test_eval_warns_beyond_the_context_a_parallel_form_was_distilled_at(tmp_path):
    import edgettt

    model = edgettt.load("ttt-linear-tiny-parallel")
    model.config.extra["distilled_ctx"] = 512  # (the shipped one holds to 8192: a copy said to hold to 512)
    edgettt.save(model, tmp_path / "m")
    runner = CliRunner()
    beyond = runner.invoke(cli, ["eval", str(tmp_path / "m"), "--data", "python-docs-sample", "--ctx", "1024",
                                 "--max-tokens", "1024"])
    within = runner.invoke(cli, ["eval", str(tmp_path / "m"), "--data", "python-docs-sample", "--ctx", "512",
                                "--max-tokens", "512"])
    assert beyond.exit_code == 0 and within.exit_code == 0, beyond.output + within.output
    assert "distilled at 512 tokens" in beyond.output and "distilled at" not in within.output


def test_a_list_of_contexts_gives_one_row_each_the_same_as_one_run_each(models, tmp_path):
    result = run("eval", models / "par", "--ref", models / "ttt", "--data", "python-docs-sample", "--ctx", "64,256",
                 "--max-tokens", "1024", "--json", tmp_path / "sweep.json")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| 64 |") or line.startswith("| 256 |")]
    assert len(rows) == 2 and "KLD mean" in result.output
    sweep = json.loads((tmp_path / "sweep.json").read_text())["contexts"]
    assert [r["ctx"] for r in sweep] == [64, 256] and [r["windows"] for r in sweep] == [16, 4]
    for r in sweep:  # each row is what a run at that one length reports
        one = run("eval", models / "par", "--ref", models / "ttt", "--data", "python-docs-sample", "--ctx", r["ctx"],
                  "--max-tokens", "1024", "--json", tmp_path / f"one{r['ctx']}.json")
        assert one.exit_code == 0
        alone = json.loads((tmp_path / f"one{r['ctx']}.json").read_text())
        assert alone["bits_per_byte"] == pytest.approx(r["bits_per_byte"], rel=1e-6)
        assert alone["drift"]["kld_mean"] == pytest.approx(r["drift"]["kld_mean"], rel=1e-5)


@pytest.mark.parametrize("args,message", [
    (["--ctx", "0"], "expected comma-separated positive integers"),
    (["--ctx", "512,x"], "expected comma-separated positive integers"),
    (["--ctx", ","], "give at least one window length"),
    (["--ctx", "64,128", "--save-logits", "{tmp}/l.st"], "give one --ctx with them"),
])
def test_bad_context_lists_are_refused_before_any_work(models, tmp_path, args, message):
    result = run("eval", models / "ttt", "--data", "python-docs-sample", *(a.format(tmp=tmp_path) for a in args))
    assert result.exit_code != 0 and message in result.output
    assert list(tmp_path.iterdir()) == []


def test_the_api_takes_a_list_of_contexts(models):
    import edgettt

    model = edgettt.load(models / "ttt")
    results = edgettt.evaluate(model, "python-docs-sample", ctx=[64, 128], max_tokens=512)
    assert [r.report["ctx"] for r in results] == [64, 128]
