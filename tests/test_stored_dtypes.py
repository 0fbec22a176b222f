"""Every command on models whose files store bfloat16 or float16 (float32 files: every other test's models).
A model computes in float32 whatever its file holds (`checkpoint.upcast_16bit`); what differs is how a file
is read and written, which each step below does in both 16-bit types. An export traces the float32 model
whatever its file held (and takes ~30 s here): TTT's from a bfloat16 file is the README's own pipeline (the
shipped models are bfloat16 files: tests/test_readme.py quantizes, exports, runs with a saved and loaded state,
evaluates and benches ttt-linear-tiny-parallel's), so here LaCT's, from a float16 file."""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from test_lact import W1_ONLY, random_model, save_public

from edgettt import load
from edgettt.checkpoint import save_model
from edgettt.cli import cli

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
FILE_DTYPES = {"bfloat16": "BF16", "float16": "F16"}
TTT = ["--set", "hidden_size=32", "--set", "num_hidden_layers=2", "--set", "num_attention_heads=4", "--set",
       "intermediate_size=64", "--set", "mini_batch_size=8"]


def ok(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, f"{' '.join(map(str, args))}\n{result.output}"
    return result.output


def stored_dtypes(model_dir) -> set[str]:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return {str(f.get_slice(k).get_dtype()) for k in f.keys()}


def store(source, out, dtype: torch.dtype):
    save_model(load(source, dtype="stored"), out, store=dtype)
    return out


@pytest.mark.parametrize("name", list(DTYPES))
def test_every_command_on_a_ttt_model_stored_in_each_precision(tmp_path, name):
    w = tmp_path
    (w / "text.txt").write_text("def f(x):\n    return x + 1\n" * 60)
    text = ["--data", w / "text.txt"]
    ok("create", w / "ttt32", *TTT)
    store(w / "ttt32", w / "ttt", DTYPES[name])
    assert FILE_DTYPES[name] in stored_dtypes(w / "ttt")
    ok("info", w / "ttt")
    ok("convert", w / "ttt", w / "par", "--form", "parallel", *text, "--ctx", 16, "--max-tokens", 200)
    assert stored_dtypes(w / "par") == stored_dtypes(w / "ttt")  # the file's precision kept
    ok("eval", w / "par", "--ref", w / "ttt", *text, "--ctx", 16, "--max-tokens", 200)
    ok("calibrate", w / "par", w / "cal.st", *text, "--ctx", 16, "--samples", 2)
    ok("quantize", w / "par", w / "qn", "--weights", "none")
    ok("quantize", w / "par", w / "q8", "--weights", "int8-gptq", "--state", "int8", "--calib", w / "cal.st")
    ok("quantize", w / "par", w / "q4", "--weights", "int4-gptq-g32", "--state", "int12", "--calib", w / "cal.st")
    for q in ("qn", "q8", "q4"):
        ok("info", w / q)
        ok("eval", w / q, "--ref", w / "par", *text, "--ctx", 16, "--max-tokens", 200, "--json", w / f"{q}.json")
        drift = json.loads((w / f"{q}.json").read_text())["drift"]
        assert drift["kld_mean"] < (1e-9 if q == "qn" else 0.5)  # none: the float model's own numbers
    ok("bench", w / "par", w / "q4", "--pp", 8, "--tg", 2, "--depth", 0, "-r", 1)
    if name == "float16":  # (a bfloat16 file's report: the README's main job, on the shipped ttt-linear-tiny)
        ok("report", w / "par", w / "rep", "--data", w / "text.txt", "--calib-data", w / "text.txt", "--ctx", 16,
           "--max-tokens", 200, "--weights", "int8", "--state", "fp16")


@pytest.mark.parametrize("name", list(DTYPES))
def test_a_lact_model_stored_in_each_precision_converts_quantizes_and_exports(tmp_path, name):
    """LaCT's parallel form exported from a 16-bit file: its check against float64 runs the references in
    float64 (they once cast to float32 there)."""
    src = save_public(random_model(**W1_ONLY, vocab_size=256, num_hidden_layers=1), tmp_path / "src32")
    store(src, tmp_path / "src", DTYPES[name])
    (tmp_path / "text.txt").write_text("def f(x):\n    return x + 1\n" * 20)
    ok("convert", tmp_path / "src", tmp_path / "par", "--form", "parallel", "--no-report")
    ok("quantize", tmp_path / "par", tmp_path / "qn", "--weights", "none")
    ok("eval", tmp_path / "qn", "--ref", tmp_path / "par", "--data", tmp_path / "text.txt", "--ctx", 16)
    if name == "float16":
        ok("export", tmp_path / "par", tmp_path / "e", "--data", tmp_path / "text.txt")
        ok("run", tmp_path / "e", "--prompt", "def", "--max-new-tokens", 3)
