"""ttt-lm-jax checkpoints against the JAX code's own logits.

The fixtures in tests/jax_fixtures were written by the public JAX code itself (its model, its
StreamingCheckpointer; `make_jax_fixtures.py` beside them), one per option set: TTT-Linear and
TTT-MLP, the gated blocks with q/k convolutions and the `_base` ones, with and without the
pre-convolution, tied and separate lm_head, parameters alone and the whole train state in bfloat16,
and options read from a config file beside the checkpoint. edgettt's logits must equal the JAX
code's to 1e-5 relative in float32, loaded directly and after conversion to the exact form.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import word_tokenizer

import edgettt
from edgettt.cli import cli
from edgettt.errors import EdgetttError

FIXTURES = Path(__file__).parent / "jax_fixtures"
MANIFEST = json.loads((FIXTURES / "fixtures.json").read_text())
NAMES = sorted(MANIFEST)


def reference(name):
    ref = np.load(FIXTURES / name / "reference.npz", allow_pickle=False)
    return torch.from_numpy(ref["tokens"]), torch.from_numpy(ref["logits"])


def max_relative(actual, expected):
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def logits_of(model, tokens):
    with torch.no_grad():
        return model(tokens).float()


def test_every_option_set_has_a_fixture():
    blocks = {entry["config"]["seq_modeling_block"] for entry in MANIFEST.values()}
    assert blocks == {"ttt_linear", "ttt_mlp", "ttt_linear_base", "ttt_mlp_base"}
    configs = [entry["config"] for entry in MANIFEST.values()]
    assert {c["pre_conv"] for c in configs} == {True, False}
    assert {c["tie_word_embeddings"] for c in configs} == {True, False}
    assert {entry["saved"]["kind"] for entry in MANIFEST.values()} == {"params", "train_state"}
    assert {entry["saved"]["float_dtype"] for entry in MANIFEST.values()} == {"fp32", "bf16"}


@pytest.mark.parametrize("name", NAMES)
def test_logits_equal_the_jax_code(name):
    tokens, expected = reference(name)
    model = edgettt.load(FIXTURES / name)
    assert max_relative(logits_of(model, tokens), expected) < 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_the_config_is_the_one_the_jax_code_ran(name):
    jax = MANIFEST[name]["config"]
    config = edgettt.load(FIXTURES / name).config
    block = jax["seq_modeling_block"]
    assert config.ttt_layer_type == ("mlp" if "mlp" in block else "linear")
    assert config.use_gate == config.share_qk == (not block.endswith("_base"))
    assert (config.pre_conv, config.tie_word_embeddings) == (jax["pre_conv"], jax["tie_word_embeddings"])
    assert (config.ttt_base_lr, config.rope_theta, config.rms_norm_eps) == \
        (jax["ttt_base_lr"], jax["rope_theta"], jax["rms_norm_eps"])
    assert (config.mini_batch_size, config.hidden_size, config.num_attention_heads, config.intermediate_size,
            config.num_hidden_layers, config.vocab_size) == \
        (jax["mini_batch_size"], jax["hidden_size"], jax["num_attention_heads"], jax["intermediate_size"],
         jax["num_hidden_layers"], jax["vocab_size"])
    if config.pre_conv or config.share_qk:
        assert config.conv_kernel == jax["conv_width"]


@pytest.mark.parametrize("name", ["ttt-linear-trainstate-bf16", "ttt-mlp"])
def test_the_exact_form_equals_the_jax_code(name):
    tokens, expected = reference(name)
    exact = edgettt.convert(edgettt.load(FIXTURES / name), "exact")
    assert max_relative(logits_of(exact, tokens), expected) < 1e-5


def test_a_bfloat16_checkpoint_keeps_its_precision_when_asked():
    model = edgettt.load(FIXTURES / "ttt-linear-trainstate-bf16", dtype=torch.bfloat16)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_convert_writes_the_model_its_card_and_the_given_tokenizer(tmp_path):
    src = FIXTURES / "ttt-mlp" / "streaming_params"
    tok = word_tokenizer(tmp_path / "tokenizer.json", 90)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{(i * 7) % 89 + 1}" for i in range(400)))
    result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "out"), "--form", "parallel",
                                      "--tokenizer", str(tok), "--data", str(text), "--ctx", "32"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    card = (out / "MODEL_CARD.md").read_text()
    assert "ttt-lm-jax" in card and "do not generate coherent text" in card and "streaming_params" in card
    assert (out / "tokenizer.json").read_bytes() == tok.read_bytes()
    converted = edgettt.load(out)
    assert converted.config.form == "parallel" and converted.tokenizer.encode("w3 w4") == [3, 4]
    assert "perplexity" in result.output


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    tok = word_tokenizer(tmp_path / "tokenizer.json", 200)
    result = CliRunner().invoke(cli, ["convert", str(FIXTURES / "ttt-mlp"), str(tmp_path / "out"), "--no-report",
                                      "--tokenizer", str(tok)])
    assert result.exit_code == 1 and "200 tokens" in result.output and "96" in result.output
    assert not (tmp_path / "out").exists()


def test_a_config_beside_that_disagrees_with_the_weights_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "streaming_params").write_bytes((FIXTURES / "ttt-mlp-config-beside" / "streaming_params").read_bytes())
    config = json.loads((FIXTURES / "ttt-mlp-config-beside" / "model_config.json").read_text())
    (folder / "model_config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    with pytest.raises(EdgetttError, match="hidden_size 64 disagrees"):
        edgettt.load(folder)


def test_an_array_in_flax_chunks_reads_as_one(tmp_path):
    """flax writes an array above 1 GiB as chunks ({"__msgpack_chunked_array__", shape, chunks}); the
    embedding written that way must give the same model."""
    import msgpack

    def array(t):
        return msgpack.ExtType(1, msgpack.packb((list(t.shape), "float32", t.numpy().tobytes())))

    records = []
    with open(FIXTURES / "ttt-linear" / "streaming_params", "rb") as f:
        for key, value in msgpack.Unpacker(f, raw=False):
            if key == ["model", "wte", "embedding"]:
                flat = edgettt.load(FIXTURES / "ttt-linear").model.embed_tokens.weight.detach().reshape(-1)
                parts = flat.split(1000)
                value = msgpack.packb({"__msgpack_chunked_array__": True, "shape": {"0": 96, "1": 32},
                                       "chunks": {str(i): array(p) for i, p in enumerate(parts)}})
            records.append(msgpack.packb((key, value)))
    (tmp_path / "streaming_params").write_bytes(b"".join(records))
    tokens, expected = reference("ttt-linear")
    assert max_relative(logits_of(edgettt.load(tmp_path), tokens), expected) < 1e-5


def test_info_takes_a_jax_checkpoint():
    """info of a checkpoint file: the model it holds (no model directory's headers to count its bytes by)."""
    result = CliRunner().invoke(cli, ["info", str(FIXTURES / "ttt-mlp"), "--json", "-"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.output)
    assert facts["family"] == "ttt-mlp" and facts["parameters"] > 0


@pytest.mark.parametrize("config_name", [None, "config.json", "model_config.json"])
def test_info_eval_and_bench_take_a_jax_folder_as_convert_does(tmp_path, config_name):
    """A streaming_params folder with the JAX config saved beside it as config.json (or model_config.json, or none):
    every command that reads a model opens it (info and eval once took config.json for a model directory's)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "streaming_params").write_bytes((FIXTURES / "ttt-mlp-config-beside" / "streaming_params").read_bytes())
    if config_name:
        (folder / config_name).write_text((FIXTURES / "ttt-mlp-config-beside" / "model_config.json").read_text())
    word_tokenizer(folder / "tokenizer.json", 90)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{(i * 7) % 89 + 1}" for i in range(200)))

    def ok(*args):
        result = CliRunner().invoke(cli, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result.output

    facts = json.loads(ok("info", folder, "--json", "-"))
    assert facts["family"] == "ttt-mlp" and facts["parameters"] > 0
    ok("eval", folder, "--data", text, "--ctx", 32, "--json", tmp_path / "e.json")
    assert json.loads((tmp_path / "e.json").read_text())["model"]["parameters"] == facts["parameters"]
    assert "tg2@d0" in ok("bench", folder, "--pp", 8, "--tg", 2, "-r", 1)
