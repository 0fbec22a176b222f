"""The models that ship inside the package load by name and reach their documented numbers."""

import json
from pathlib import Path

import pytest
import torch

import edgettt
from conftest import check_documented_slice, schedules, stored_dtypes
from edgettt.checkpoint import SHIPPED_MODELS, shipped_models
from edgettt.data import read_text

NAMES = ["ttt-linear-tiny", "ttt-mlp-tiny"]
PARALLEL_NAMES = ["ttt-linear-tiny-parallel", "ttt-mlp-tiny-parallel"]  # the distilled parallel forms
LACT_NAMES = ["lact-tiny", "lact-w1-tiny"]
DELTANET_NAMES = ["gated-deltanet-tiny"]  # trained as ttt-linear-tiny was, to compare the layers
PREVIOUS_PARAMETERS = 1_864_208  # ttt-linear-tiny until 2026-12-03 (about twice that)
TRANSFORMER_LOG = Path(__file__).parent.parent / "recipes" / "results" / "transformer-baseline.train_log.json"


def test_shipped_models_are_listed():
    assert set(NAMES + PARALLEL_NAMES + LACT_NAMES + DELTANET_NAMES) <= set(shipped_models())


@pytest.mark.parametrize("name", LACT_NAMES)
def test_lact_models_load_by_name_within_size_with_a_card(name):
    model = edgettt.load(name)
    assert model.config.family == "lact" and model.form == "lact" and model.config.vocab_size == 256
    assert model.config.w1_only == (name == "lact-w1-tiny")
    files = SHIPPED_MODELS / name
    assert sum(f.stat().st_size for f in files.iterdir()) <= 8 * 2**20
    assert (files / "MODEL_CARD.md").exists()


def test_the_parallel_form_of_lact_w1_tiny_equals_it_without_distillation():
    """The W1-only LaCT model's linear-attention form: the same logits over 16 chunks (no distillation)."""
    model = edgettt.load("lact-w1-tiny")
    ids = torch.tensor([list(read_text("python-docs:test").data[:1024])])
    with torch.no_grad():
        ref, parallel = model(ids), edgettt.convert(model, "parallel")(ids)
    assert ((parallel - ref).abs().max() / ref.abs().max()).item() < 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_loads_by_name_within_size_and_with_a_byte_tokenizer(name):
    model = edgettt.load(name)
    assert model.form == "ttt" and model.config.vocab_size == 256
    assert (SHIPPED_MODELS / name / "MODEL_CARD.md").exists()
    text = "def f(x):\n    return 'é'\n"
    assert model.tokenizer.decode(model.tokenizer.encode(text)) == text


@pytest.mark.parametrize("name", NAMES + PARALLEL_NAMES + LACT_NAMES + DELTANET_NAMES)
def test_reaches_its_documented_bits_per_byte_on_a_slice_of_the_test_split(name):
    """Every slice number in eval.json: at the slice's context, and for the distilled parallel forms at 2048
    and 8192 tokens too (within 3% of the original on the whole test part, MODEL_CARD.md)."""
    documented = json.loads((SHIPPED_MODELS / name / "eval.json").read_text())
    measured = check_documented_slice(edgettt.load(name), name, documented)
    assert (len(measured) == 3) == (name in NAMES + PARALLEL_NAMES + DELTANET_NAMES)


@pytest.mark.parametrize("name", NAMES + PARALLEL_NAMES)
def test_the_ttt_models_are_twice_the_size_in_bfloat16_within_8_mb(name):
    """Issue 23 item 3: about twice the parameters of the models shipped before, stored in bfloat16."""
    files = SHIPPED_MODELS / name
    assert sum(f.stat().st_size for f in files.iterdir()) <= 8 * 2**20
    assert stored_dtypes(files) == {"BF16"}
    assert sum(p.numel() for p in edgettt.load(name).parameters()) > 1.8 * PREVIOUS_PARAMETERS


@pytest.mark.parametrize("name", NAMES)
def test_documented_numbers_meet_issue_23(name):
    """eval.json's whole-test numbers (the slice test above re-measures a part of each): an original <= 1.32
    bits per byte and within 5% of the same-size transformer trained the same way (its committed log); its
    parallel form within 3% of it at 512, 2048 and 8192 (item 1)."""
    original = json.loads((SHIPPED_MODELS / name / "eval.json").read_text())
    parallel = json.loads((SHIPPED_MODELS / f"{name}-parallel" / "eval.json").read_text())
    transformer = json.loads(TRANSFORMER_LOG.read_text())
    assert original["test_bits_per_byte"] <= 1.32
    assert original["test_bits_per_byte"] <= 1.05 * transformer["test_bits_per_byte"]
    assert transformer["parameters"] == pytest.approx(sum(p.numel() for p in edgettt.load(name).parameters()), rel=0.1)
    assert parallel["original_test_bits_per_byte_by_ctx"] == pytest.approx(original["test_bits_per_byte_by_ctx"], abs=1e-5)
    assert set(parallel["test_bits_per_byte_by_ctx"]) == {"512", "2048", "8192"}
    for ctx, bits in parallel["test_bits_per_byte_by_ctx"].items():
        assert bits <= 1.03 * original["test_bits_per_byte_by_ctx"][ctx], ctx


def test_gated_deltanet_tiny_is_trained_as_ttt_linear_tiny_and_documents_its_place():
    """Issue 73 item 3: the same recipe (the schedules of ttt-linear-tiny's committed log), parameters within 5%
    of ttt-linear-tiny's, bf16 within 8 MB with a card; its held-out numbers at every length in eval.json."""
    model = edgettt.load("gated-deltanet-tiny")
    assert model.config.family == "gated_deltanet" and model.config.vocab_size == 256
    files = SHIPPED_MODELS / "gated-deltanet-tiny"
    assert sum(f.stat().st_size for f in files.iterdir()) <= 8 * 2**20 and stored_dtypes(files) == {"BF16"}
    assert (files / "MODEL_CARD.md").exists()
    ttt = sum(p.numel() for p in edgettt.load("ttt-linear-tiny").parameters())
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(ttt, rel=0.05)
    results = Path(__file__).parent.parent / "recipes" / "results"
    recipe = lambda log: [(s["steps"], s["lr"], s["docs_weight"], s["dropout"], s["batch"], s["ctx"])  # noqa: E731
                          for s in schedules(json.loads((results / f"{log}.train_log.json").read_text()))]
    assert recipe("gated-deltanet-tiny") == recipe("ttt-linear-tiny")
    documented = json.loads((files / "eval.json").read_text())
    assert set(documented["test_bits_per_byte_by_ctx"]) == {"512", "2048", "8192"}
    assert documented["held_out"] and documented["test_bits_per_byte"] < 1.32


def test_exact_conversion_of_a_shipped_model_is_exact():
    model = edgettt.load("ttt-mlp-tiny")
    ids = torch.tensor([model.tokenizer.encode("import os\nprint(os.getcwd())\n" * 3)])
    with torch.no_grad():
        ref, exact = model(ids), edgettt.convert(model, "exact")(ids)
    assert ((exact - ref).norm() / ref.norm()).item() < 1e-5
