"""Reading and writing checkpoints in the ttt-lm-pytorch layout, and refusing bad ones."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import stored_dtypes, tiny_config
from edgettt import EdgetttError, ModelConfig, load, random_model
from edgettt.checkpoint import save_model

PREFIX = "model.layers.0.seq_modeling_block."


@pytest.fixture
def checkpoint(tmp_path):
    model = random_model(tiny_config(ttt_layer_type="mlp", share_qk=True, pre_conv=True, use_gate=True), 1)
    save_model(model, tmp_path / "ckpt")
    return model, tmp_path / "ckpt"


def test_layout_has_the_published_key_names(checkpoint):
    _, path = checkpoint
    names = set(load_file(path / "model.safetensors"))
    for leaf in ("q_proj.weight", "v_proj.weight", "o_proj.weight", "g_proj.weight", "conv_q.weight",
                 "conv_k.bias", "learnable_token_idx", "learnable_ttt_lr_weight", "learnable_ttt_lr_bias",
                 "ttt_norm_weight", "ttt_norm_bias", "post_norm.weight", "W1", "b1", "W2", "b2"):
        assert PREFIX + leaf in names
    assert PREFIX + "k_proj.weight" not in names  # share_qk
    assert "model.layers.0.conv.conv.weight" in names and "model.layers.0.conv.norm.weight" in names
    assert "lm_head.weight" not in names  # tied
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "ttt" and config["ttt_layer_type"] == "mlp"


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_round_trip(tmp_path, fmt):
    model = random_model(tiny_config(tie_word_embeddings=False), 2)
    save_model(model, tmp_path / "m", weights_format=fmt)
    loaded = load(tmp_path / "m")
    ids = torch.randint(0, 61, (2, 13))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_unknown_config_keys_are_kept_and_missing_keys_default(tmp_path, checkpoint):
    _, path = checkpoint
    raw = json.loads((path / "config.json").read_text())
    raw["architectures"] = ["TTTForCausalLM"]
    del raw["rope_theta"]
    config = ModelConfig.from_dict(raw)
    assert config.rope_theta == 10000.0 and config.to_dict()["architectures"] == ["TTTForCausalLM"]


def test_tied_checkpoint_may_carry_an_equal_lm_head(tmp_path, checkpoint):
    model, path = checkpoint
    weights = load_file(path / "model.safetensors")
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, path / "model.safetensors")
    load(path)
    weights["lm_head.weight"] += 1
    save_file(weights, path / "model.safetensors")
    with pytest.raises(EdgetttError, match="differs from the embedding"):
        load(path)


def edit_weights(path, change):
    weights = load_file(path / "model.safetensors")
    change(weights)
    save_file(weights, path / "model.safetensors")


def edit_config(path, change):
    raw = json.loads((path / "config.json").read_text())
    change(raw)
    (path / "config.json").write_text(json.dumps(raw))


BAD_CHECKPOINTS = {
    "missing tensor": (lambda p: edit_weights(p, lambda w: w.pop(PREFIX + "W2")), f"missing tensors: {PREFIX}W2"),
    "extra tensor": (lambda p: edit_weights(p, lambda w: w.update(stray=torch.zeros(2))), "unexpected tensors: stray"),
    "mis-shaped": (lambda p: edit_weights(p, lambda w: w.update({PREFIX + "b1": torch.zeros(4, 1, 5)})),
                   rf"mis-shaped tensors: {PREFIX}b1 \(4, 1, 5\) \(expected \(4, 1, 32\)\)"),
    "non-finite": (lambda p: edit_weights(p, lambda w: w[PREFIX + "W1"].view(-1).__setitem__(3, float("nan"))),
                   f"non-finite values .* in {PREFIX}W1"),
    "wrong model_type": (lambda p: edit_config(p, lambda c: c.update(model_type="llama")), "model_type is 'llama'"),
    "inconsistent sizes": (lambda p: edit_config(p, lambda c: c.update(num_attention_heads=5)),
                           "not divisible by num_attention_heads"),
    "bad layer type": (lambda p: edit_config(p, lambda c: c.update(ttt_layer_type="conv")), "ttt_layer_type"),
    "broken json": (lambda p: (p / "config.json").write_text("{oops"), "not readable JSON"),
    "no weights": (lambda p: (p / "model.safetensors").unlink(), "weights are missing"),
    "corrupt weights": (lambda p: (p / "model.safetensors").write_bytes(b"garbage" * 10), "not a readable safetensors"),
}


@pytest.mark.parametrize("case", BAD_CHECKPOINTS)
def test_bad_checkpoints_are_refused_with_a_named_reason(checkpoint, case):
    _, path = checkpoint
    spoil, message = BAD_CHECKPOINTS[case]
    spoil(path)
    with pytest.raises(EdgetttError, match=message):
        load(path)


class Payload:
    """Not a tensor: a weights-only unpickler must refuse it."""


def test_pickle_with_code_is_refused(tmp_path):
    model = random_model(tiny_config(), 0)
    save_model(model, tmp_path / "m", weights_format="bin")
    weights = torch.load(tmp_path / "m" / "pytorch_model.bin", weights_only=True)
    weights["evil"] = Payload()
    torch.save(weights, tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(EdgetttError, match="not a weights-only pickle"):
        load(tmp_path / "m")


def test_missing_directory(tmp_path):
    with pytest.raises(EdgetttError, match="no such directory"):
        load(tmp_path / "nowhere")


def test_tokenizer_json_is_used_and_travels_with_the_model(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from edgettt import convert
    from edgettt.data import Text
    from edgettt.evaluation import conversion_report

    vocab = {w: i for i, w in enumerate(["[UNK]", "def", "return", "x", "(", ")", ":", "+", "1"])}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    model = random_model(tiny_config(vocab_size=len(vocab)), 3)
    save_model(model, tmp_path / "m")
    tok.save(str(tmp_path / "m" / "tokenizer.json"))
    loaded = load(tmp_path / "m")
    assert loaded.tokenizer.name == "tokenizer.json"
    assert loaded.tokenizer.encode("def x ( ) : return x + 1") == [1, 3, 4, 5, 6, 2, 3, 7, 8]
    report = conversion_report(loaded, convert(loaded, "parallel"), Text("t", b"def x ( ) : return x + 1 " * 40), 32, None)
    assert report["windows"] == (9 * 40 - 1) // 32 and report["ref"]["ppl"] > 1
    save_model(convert(loaded, "exact"), tmp_path / "c")
    assert (tmp_path / "c" / "tokenizer.json").exists() and load(tmp_path / "c").tokenizer.name == "tokenizer.json"


def test_sharded_checkpoints_are_read_and_written(tmp_path):
    """Hugging Face's layout above a few GB: shards and model.safetensors.index.json. Written when the
    weights exceed max_shard_bytes, read back tensor for tensor; a shard the index names but the
    directory lacks, or one outside it, is a one-line error."""
    import json

    import edgettt
    from edgettt.checkpoint import save_model
    from edgettt.outputs import recognise

    model = edgettt.load("ttt-linear-tiny")
    save_model(model, tmp_path / "s", max_shard_bytes=2_000_000)
    shards = sorted(p.name for p in (tmp_path / "s").glob("model-*.safetensors"))
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "s" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.weights()) and not (tmp_path / "s" / "model.safetensors").exists()
    again = edgettt.load(tmp_path / "s")
    for name, t in model.weights().items():
        assert torch.equal(again.weights()[name], t), name
    assert recognise(tmp_path / "s", "model")  # --force may replace it
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors"
    (tmp_path / "s" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(edgettt.EdgetttError, match="not a file inside"):
        edgettt.load(tmp_path / "s")
    (tmp_path / "s" / shards[-1]).unlink()
    index["weight_map"]["model.norm.weight"] = shards[0]
    (tmp_path / "s" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(edgettt.EdgetttError, match="not a file inside"):
        edgettt.load(tmp_path / "s")


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
def test_a_model_stored_in_16_bits_loads_in_float32_holding_the_stored_values(tmp_path, stored):
    """Half the file (the embedded models) without computing in 16 bits on a CPU."""
    model = random_model(tiny_config(), 3)
    save_model(model.to(stored), tmp_path / "m")
    loaded = load(tmp_path / "m")
    for name, p in loaded.state_dict().items():
        assert p.dtype == torch.float32, name
        assert torch.equal(p, model.state_dict()[name].float()), name
    assert load(tmp_path / "m", dtype=stored).model.embed_tokens.weight.dtype == stored


def test_store_keeps_matrices_in_16_bits_and_vectors_in_float32(tmp_path):
    """save_model(store=torch.bfloat16): the floating matrices in bfloat16 (half the bytes), the vectors (norms,
    biases, decay rates) as they were; loaded back as float32 holding exactly what was stored."""
    model = random_model(tiny_config(), 5)
    save_model(model, tmp_path / "m", store=torch.bfloat16)
    assert stored_dtypes(tmp_path / "m") == {"BF16"}
    assert stored_dtypes(tmp_path / "m", matrices=False) == {"F32"}
    loaded, original = load(tmp_path / "m").state_dict(), model.state_dict()
    for name, p in loaded.items():
        want = original[name].to(torch.bfloat16).float() if original[name].dim() >= 2 else original[name]
        assert p.dtype == torch.float32 and torch.equal(p, want), name



@pytest.mark.parametrize("name", ["ttt-linear-tiny", "lact-w1-tiny"])
def test_one_size_as_stored_for_a_model_its_conversion_and_its_report_row(tmp_path, name):
    """A bfloat16 file's model counts 16 bits a floating matrix wherever a size is given: the report's rows
    (`model_facts`) as `info` (`stored_size`, the files' bytes), its converted form (which keeps the file's
    precision when saved) alike; a quantized model counts what its file holds."""
    from edgettt import convert
    from edgettt.model_info import stored_size
    from edgettt.evaluation import model_facts
    from edgettt.quant import QuantConfig, quantize_model

    save_model(load(name), tmp_path / "m", store=torch.bfloat16)
    model = load(tmp_path / "m")
    facts = model_facts(model, name)
    on_disk = stored_size(tmp_path / "m", facts["parameters"])
    assert facts["size_mb"] == pytest.approx(on_disk["size_mb"], rel=1e-4)
    assert 16 <= facts["bits_per_weight"] < 17  # bfloat16 matrices, a few float32 vectors
    parallel = convert(model, "parallel")
    assert model_facts(parallel, name)["size_mb"] == pytest.approx(facts["size_mb"], rel=1e-4)
    quantize_model(parallel, QuantConfig(weights="int8", state="fp32"))
    assert model_facts(parallel, name)["bits_per_weight"] < 12  # int8 codes, float32 scales and vectors
