"""DeltaNet and Gated DeltaNet against flash-linear-attention's own code.

The fixtures in tests/fla_fixtures were written by fla 0.6 itself (`make_fla_fixtures.py` beside them): one small
checkpoint per option set, saved by its `save_pretrained`, with its model's float32 logits, and the outputs of its
naive delta-rule references on random inputs. edgettt's logits must equal fla's to 1e-5 relative in float32, and
its recurrent and chunked delta rule fla's naive ones.
"""

import collections
import json
import shutil
from pathlib import Path

import onnx
import pytest
import torch
from click.testing import CliRunner
from conftest import rel_err
from safetensors.torch import load_file, save_file

import edgettt
from edgettt.cli import cli
from edgettt.errors import EdgetttError
from edgettt.ops.delta_rule import reference as delta_rule

FIXTURES = Path(__file__).parent / "fla_fixtures"
NAMES = json.loads((FIXTURES / "fixtures.json").read_text())["fixtures"]


def max_relative(actual, expected):
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def logits_of(model, tokens):
    with torch.no_grad():
        return model(tokens).float()


def heads_first(t):
    return t.transpose(1, 2)  # fla's [B, T, H, ...] -> [B, H, T, ...]


@pytest.mark.parametrize("form", ["recurrent", "chunk"])
def test_delta_rule_equals_fla_naive_references(form):
    ref = load_file(FIXTURES / "delta_rule.safetensors")
    q, k, v, beta, g = (heads_first(ref[n]) for n in ("q", "k", "v", "beta", "g"))
    o, state = getattr(delta_rule, form)(q, k, v, beta, g, ref["initial_state"])
    for fla_form in ("recurrent", "chunk"):  # fla's two naive forms agree to float32 rounding
        assert rel_err(heads_first(o), ref[f"{fla_form}_o"]) < 1e-5
        assert rel_err(state, ref[f"{fla_form}_state"]) < 1e-5


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("length,chunk_size", [(1, 64), (37, 16), (64, 64), (130, 32)])
def test_chunk_equals_recurrent_in_float64(gated, length, chunk_size):
    gen = torch.Generator().manual_seed(length)
    B, H, K, V = 2, 3, 8, 12
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, length, K, generator=gen, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(B, H, length, V, generator=gen, dtype=torch.float64)
    beta = 2 * torch.rand(B, H, length, generator=gen, dtype=torch.float64)  # allow_neg_eigval's range
    g = -torch.rand(B, H, length, generator=gen, dtype=torch.float64) if gated else None
    state = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    o_rec, s_rec = delta_rule.recurrent(q, k, v, beta, g, state)
    o_chunk, s_chunk = delta_rule.chunk(q, k, v, beta, g, state, chunk_size=chunk_size)
    assert o_chunk.dtype == s_chunk.dtype == torch.float64
    assert rel_err(o_chunk, o_rec) < 1e-12 and rel_err(s_chunk, s_rec) < 1e-12


def test_every_option_fla_has_is_in_a_fixture():
    configs = [json.loads((FIXTURES / n / "config.json").read_text()) for n in NAMES]
    by_type = {t: [c for c in configs if c["model_type"] == t] for t in ("gated_deltanet", "delta_net")}
    for t, cs in by_type.items():
        for switch in ("use_short_conv", "use_gate", "allow_neg_eigval", "tie_word_embeddings"):
            assert {c[switch] for c in cs} == {True, False}, (t, switch)
    gdn, dn = by_type["gated_deltanet"], by_type["delta_net"]
    assert {c["output_gate_activation"] for c in gdn} == {"swish", "sigmoid"}
    assert any(c["num_v_heads"] and c["num_v_heads"] > c["num_heads"] for c in gdn)
    assert {c["expand_v"] for c in gdn} == {1.0, 2.0} and {c["expand_v"] for c in dn} == {1.0, 2.0}
    assert {c["qk_activation"] for c in dn} == {"silu", "relu", "elu", "identity"}
    assert {c["qk_norm"] for c in dn} == {"l2", "sum"} and {c["use_beta"] for c in dn} == {True, False}
    assert {c["expand_k"] for c in dn} == {0.5, 1.0}


@pytest.mark.parametrize("name", NAMES)
def test_logits_equal_fla(name):
    ref = load_file(FIXTURES / name / "reference.safetensors")
    model = edgettt.load(FIXTURES / name)
    logits = logits_of(model, ref["tokens"])
    assert rel_err(logits, ref["logits"]) < 1e-5
    assert max_relative(logits, ref["logits"]) < 1e-5


@pytest.mark.parametrize("name", ["gdn-grouped-sigmoid-tied", "dn-gate-relu-sum-negeig"])
def test_decode_and_pieces_continue_the_prefill(name):
    """A prefill in pieces (the chunked form from a state), then a token at a time (the recurrence), equals one
    prefill of the whole text."""
    ref = load_file(FIXTURES / name / "reference.safetensors")
    model, tokens = edgettt.load(FIXTURES / name), ref["tokens"]
    with torch.no_grad():
        first, state = model.prefill(tokens[:, :50])
        second, state = model.prefill(tokens[:, 50:70], state)
        steps = [model.step(tokens[:, t], state)[0] for t in range(70, tokens.shape[1])]
    pieces = torch.cat([first, second, torch.stack(steps, dim=1)], dim=1)
    assert rel_err(pieces, ref["logits"]) < 1e-5


def test_sharded_and_16_bit_checkpoints_load(tmp_path):
    """fla's larger uploads come as shards with an index; the hub's are in bfloat16."""
    source = FIXTURES / "gdn"
    weights = load_file(source / "model.safetensors")
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    out = tmp_path / "sharded"
    out.mkdir()
    shutil.copy(source / "config.json", out)
    for shard, keys in shards.items():
        save_file({k: weights[k].bfloat16() for k in keys}, str(out / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    ref = load_file(source / "reference.safetensors")
    rounded = edgettt.load(source)
    rounded.load_state_dict({k: v.bfloat16().float() for k, v in rounded.state_dict().items()})
    assert rel_err(logits_of(edgettt.load(out), ref["tokens"]), logits_of(rounded, ref["tokens"])) < 1e-6


def config_change(**changes):
    def change(config: dict, weights: dict) -> None:
        config.update(changes)
    return change


def weights_renamed(old: str, new: str):
    def change(config: dict, weights: dict) -> None:
        weights[new] = weights.pop(old)
    return change


BAD_CHECKPOINTS = {  # name -> (change to the gdn fixture, what the one-line error says)
    "gla": (config_change(model_type="gla"), "model_type is 'gla'"),
    "rwkv7": (config_change(model_type="rwkv7"), "model_type is 'rwkv7'"),
    "hybrid": (config_change(attn={"layers": [1], "num_heads": 2}), "a hybrid with attention layers"),
    "attnres": (config_change(attnres_block_size=2), "attnres_block_size is set"),
    "gate activation": (config_change(output_gate_activation="relu"), "output_gate_activation is 'relu'"),
    "expand_v": (config_change(expand_v=1.3), "head_dim 16 x expand_v 1.3 is not a whole number"),
    "v heads": (config_change(num_v_heads=3), "num_v_heads 3 is not a multiple of num_heads 2"),
    "hidden size": (config_change(hidden_size=48), "disagree with model.embeddings.weight"),
    "layers": (config_change(num_hidden_layers=3), "num_hidden_layers 3 disagrees"),
    "gate": (config_change(use_gate=False), "use_gate is false but the weights file has model.layers.0.attn.g_proj"),
    "conv size": (config_change(conv_size=3), "conv_size [32, 1, 3] disagree"),
    "GLA weights": (weights_renamed("model.layers.0.attn.a_proj.weight", "model.layers.0.attn.gk_proj.weight"),
                    "a GLA layer's weight"),
    "DeltaNet option": (config_change(model_type="delta_net", qk_activation="tanh", num_heads=2),
                        "qk_activation is 'tanh'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
def test_bad_checkpoints_get_one_line_and_nothing_written(case, tmp_path):
    change, message = BAD_CHECKPOINTS[case]
    src = tmp_path / "model"
    shutil.copytree(FIXTURES / "gdn", src)
    config = json.loads((src / "config.json").read_text())
    weights = load_file(src / "model.safetensors")
    change(config, weights)
    (src / "config.json").write_text(json.dumps(config))
    save_file(weights, str(src / "model.safetensors"))
    result = CliRunner().invoke(cli, ["quantize", str(src), str(tmp_path / "out"), "--weights", "int8"])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    with pytest.raises(EdgetttError, match=message.split(" [")[0].replace("(", r"\(")):
        edgettt.load(src)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_quantize_info_and_decode_on_each_dtype(dtype, tmp_path):
    """The commands that need no text, on a checkpoint stored in each precision: quantize to int8, info, and the
    quantized model's logits near the float model's (int8 rounds each weight to within half a step of 1/127 of
    its group's largest, about 0.6% of a Gaussian group's norm; compounded over the products of two layers and the
    int8 head, measured 2.2%)."""
    src = tmp_path / "model"
    shutil.copytree(FIXTURES / "dn", src)
    weights = load_file(src / "model.safetensors")
    save_file({k: v.to(getattr(torch, dtype)) for k, v in weights.items()}, str(src / "model.safetensors"))
    runner = CliRunner()
    out = tmp_path / "int8"
    result = runner.invoke(cli, ["quantize", str(src), str(out), "--weights", "int8"])
    assert result.exit_code == 0, result.output
    info = runner.invoke(cli, ["info", str(out)])
    assert info.exit_code == 0 and "delta_net" in info.output and "recurrent_state" in info.output
    ref = load_file(FIXTURES / "dn" / "reference.safetensors")
    float_logits = logits_of(edgettt.load(src), ref["tokens"])
    assert rel_err(logits_of(edgettt.load(out), ref["tokens"]), float_logits) < 0.05


@pytest.fixture(scope="module")
def created(tmp_path_factory):
    """A small byte-level model of each kind, as `edgettt create` writes it: one layer (an export's trace takes
    most of its tests' time, and a second layer adds nothing to what they check)."""
    root = tmp_path_factory.mktemp("created")
    for kind in ("gated-deltanet", "deltanet"):
        result = CliRunner().invoke(cli, ["create", str(root / kind), "--family", kind, "--set", "num_heads=2",
                                          "--set", "num_hidden_layers=1"])
        assert result.exit_code == 0, result.output
    return root


def test_create_writes_fla_layout_of_each_kind_and_their_published_sizes(created):
    for kind, model_type in (("gated-deltanet", "gated_deltanet"), ("deltanet", "delta_net")):
        config = json.loads((created / kind / "config.json").read_text())
        assert config["model_type"] == model_type and config["vocab_size"] == 256
        model = edgettt.load(created / kind)
        assert model.config.family == model_type and model.tokenizer is not None
    from edgettt.families.deltanet.random_init import DEFAULTS, PRESET_VOCAB, PRESETS, new_config
    for kind, presets in PRESETS.items():
        for name, sizes in presets.items():
            config = new_config(kind, {**DEFAULTS[kind], **sizes, "vocab_size": PRESET_VOCAB})
            with torch.device("meta"):
                parameters = type(edgettt.load(created / kind))(config).num_parameters()
            wanted = 0.34e9 if name == "340m" else 1.3e9
            assert 0.8 * wanted < parameters < 1.25 * wanted, (kind, name, parameters)


@pytest.mark.parametrize("args,code,message", [
    (["--family", "deltanet", "--preset", "125m"], 2, "not a published size of --family deltanet"),
    (["--family", "deltanet", "--set", "head_dim=8"], 2, "unknown key 'head_dim'"),
    (["--family", "gated-deltanet", "--set", "head_dim=5000"], 1, "head_dim must be an integer from 1 to 4,096"),
    (["--family", "gated-deltanet", "--preset", "340m", "--set", "num_heads=3"], 1, "--preset 340m sets num_heads"),
])
def test_create_refuses_what_a_kind_does_not_take(args, code, message, tmp_path):
    result = CliRunner().invoke(cli, ["create", str(tmp_path / "m"), *args])
    assert result.exit_code == code and message in result.output, result.output
    assert not (tmp_path / "m").exists()


def test_quantized_states_follow_decode_and_calibrated_int8_is_measured(created, tmp_path):
    """The state formats that apply: fp16, int12 and calibrated int8 round the state a decode step stores, after
    every token (a prefill then runs the recurrence, and equals the same tokens decoded one at a time);
    int8-tensor (its scale from the zero initial state) and int12-kv8 (no open mini-batch) are refused. (In float64:
    a token's products computed alone or in a batch differ in the last float32 bits, which a rounding can turn into
    a step of the state's grid.)"""
    runner, src = CliRunner(), created / "gated-deltanet"
    text = tmp_path / "text.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 40)
    cal = tmp_path / "cal.safetensors"
    result = runner.invoke(cli, ["calibrate", str(src), str(cal), "--data", str(text), "--ctx", "64", "--samples", "2"])
    assert result.exit_code == 0, result.output
    tokens = torch.tensor([list(text.read_bytes()[:40])])
    for state in ("fp16", "int12", "int8"):
        out = tmp_path / state
        result = runner.invoke(cli, ["quantize", str(src), str(out), "--weights", "int8", "--state", state,
                                     "--calib", str(cal)])
        assert result.exit_code == 0, result.output
        model = edgettt.load(out, dtype=torch.float64)
        with torch.no_grad():
            whole = model(tokens)
            state_ = model.init_state(1)
            steps = torch.stack([model.step(tokens[:, t], state_)[0] for t in range(tokens.shape[1])], dim=1)
        assert rel_err(steps, whole) < 1e-9, state
    for state, message in (("int8-tensor", "zero for the delta rule"), ("int12-kv8", "use --state int12")):
        result = runner.invoke(cli, ["quantize", str(src), str(tmp_path / state), "--state", state])
        assert result.exit_code == 1 and message in result.output and not (tmp_path / state).exists()


def test_the_export_verifies_genai_opens_it_and_a_saved_state_continues(shared_export, tmp_path):
    """A Gated DeltaNet exported (the chunked prefill as one Scan over the chunks, the decode step, the state by
    role; shared with tests/test_web.py, whose page runs it): it verifies against torch in onnxruntime,
    onnxruntime-genai's loop gives `edgettt run`'s tokens, and a state saved after a prompt continues as the whole
    text in one go."""
    from conftest import check_genai_generates_what_edgettt_run_generates

    runner, export = CliRunner(), shared_export("gated-deltanet")
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["verification"]["passed"], manifest["verification"]
    assert {s["role"] for s in manifest["state"]} == {"recurrent_state", "conv_state"}
    # the decode step at ONNX Runtime's operators: the delta rule's token one LinearAttention, each short convolution
    # one CausalConvWithState, the input projections one product, no transposes (docs/export.md)
    decode = onnx.load(str(export / "decode.onnx"), load_external_data=False)
    ops = collections.Counter(node.op_type for node in decode.graph.node)
    assert ops["LinearAttention"] == 1 and ops["CausalConvWithState"] == 3 and ops["Transpose"] == 0, ops
    assert ops["MatMul"] == 5 and sum(ops.values()) <= 64, ops  # (the fused inputs, o_proj, gate/up, down, lm_head)
    check_genai_generates_what_edgettt_run_generates(export, tmp_path)
    state, A, B = tmp_path / "a.st", "def main(args):\n    ", "return args."
    assert runner.invoke(cli, ["run", str(export), "--prompt", A, "--max-new-tokens", "0",
                               "--save-state", str(state)]).exit_code == 0
    tokens = {}
    for key, args in (("split", ["--load-state", str(state), "--prompt", B]), ("whole", ["--prompt", A + B])):
        result = runner.invoke(cli, ["run", str(export), *args, "--max-new-tokens", "16", "--json",
                                     str(tmp_path / f"{key}.json")])
        assert result.exit_code == 0, result.output
        tokens[key] = json.loads((tmp_path / f"{key}.json").read_text())["tokens"]
    assert tokens["split"] == tokens["whole"]


def test_a_quantized_deltanet_exports_with_its_state_format(created, tmp_path):
    """int4 weights and the int12 state, rounded after every token inside the graphs (the prefill's recurrence one
    Scan over the tokens): the export's own verification passes (prefill against torch, decode against prefill)."""
    runner, quantized = CliRunner(), tmp_path / "int4"
    result = runner.invoke(cli, ["quantize", str(created / "deltanet"), str(quantized), "--weights", "int4",
                                 "--state", "int12"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["export", str(quantized), str(tmp_path / "export")])
    assert result.exit_code == 0 and "verified in onnxruntime" in result.output, result.output


def test_convert_says_a_deltanet_is_a_linear_attention_already(created, tmp_path):
    result = CliRunner().invoke(cli, ["convert", str(created / "deltanet"), str(tmp_path / "out")])
    assert result.exit_code == 1 and "already in its own form (parallel" in result.output, result.output
    assert not (tmp_path / "out").exists()
    model = edgettt.load(created / "deltanet")
    assert edgettt.convert(model, form="exact").config.form == "parallel"


def fla_on_cuda() -> bool:
    from edgettt.ops.delta_rule.fla_kernels import fla_ops

    return torch.cuda.is_available() and fla_ops() is not None


@pytest.mark.gpu
@pytest.mark.skipif(not fla_on_cuda(), reason="needs a CUDA GPU and flash-linear-attention")
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("length", [1, 37, 200])
def test_fla_kernels_compute_the_reference_on_cuda(gated, length):
    """Through fla's chunk kernel and its fused recurrence (`ops.delta_rule.fla_kernels`) the delta rule equals the
    plain-torch reference, from a state, outputs and final state."""
    from edgettt.ops.delta_rule import fla_kernels

    gen = torch.Generator().manual_seed(length)
    B, H, K, V = 2, 3, 64, 128
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, length, K, generator=gen), dim=-1) for _ in range(2))
    v, beta = torch.randn(B, H, length, V, generator=gen), torch.rand(B, H, length, generator=gen)
    g = -torch.rand(B, H, length, generator=gen) * 0.5 if gated else None
    state = torch.randn(B, H, K, V, generator=gen) * 0.1
    expected = delta_rule.recurrent(q.double(), k.double(), v.double(), beta.double(),
                                    None if g is None else g.double(), state.double())
    cuda = [t if t is None else t.cuda() for t in (q, k, v, beta, g, state)]
    errors = {}
    for form in (fla_kernels.chunk, fla_kernels.recurrent):
        o, S = form(*cuda)
        errors[form.__name__] = max_relative(o.cpu(), expected[0]), max_relative(S.cpu(), expected[1])
    assert max(max(e) for e in errors.values()) < 1e-2, errors  # (Triton's fp32 dot products are TF32)


@pytest.mark.gpu
@pytest.mark.skipif(not fla_on_cuda(), reason="needs a CUDA GPU and flash-linear-attention")
@pytest.mark.parametrize("name", ["gdn-grouped-sigmoid-tied", "dn-gate-relu-sum-negeig"])
def test_a_model_through_fla_kernels_gives_fla_logits_and_gradients_on_cuda(name):
    """`edgettt.prepare`'s kernel layers (fla's chunk kernel in a prefill, its recurrence in decode) give the logits
    of fla's model, and train as the plain layers (through the reference: `fla_kernels` says why)."""
    from edgettt.fast_paths import use_kernels

    ref = load_file(FIXTURES / name / "reference.safetensors")
    plain, fast = edgettt.load(FIXTURES / name).cuda(), edgettt.load(FIXTURES / name).cuda()
    assert use_kernels(fast) == plain.config.num_hidden_layers
    tokens = ref["tokens"].cuda()
    losses = []
    for model in (plain, fast):
        logits = model(tokens).float()
        assert max_relative(logits.detach().cpu(), ref["logits"]) < 1e-2
        losses.append(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()))
        losses[-1].backward()
    for (name_, p), q in zip(plain.named_parameters(), fast.parameters()):
        assert max_relative(q.grad.cpu(), p.grad.cpu()) < 1e-2, name_
    with torch.no_grad():
        _, state = fast.prefill(tokens[:, :50])
        steps = [fast.step(tokens[:, t], state)[0] for t in range(50, 60)]
        prefilled = fast(tokens).float().cpu()
    assert max_relative(prefilled, ref["logits"]) < 1e-2
    assert max_relative(torch.stack(steps, 1).float().cpu(), ref["logits"][:, 50:60]) < 1e-2
