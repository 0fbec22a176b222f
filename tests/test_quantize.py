"""Quantizers: exact packing, statistical error bounds, GPTQ against rounding, quantized state."""

import json

import pytest
import torch

import edgettt
from edgettt import EdgetttError, convert, metrics
from edgettt.data import read_text
from edgettt.ops.linear_attention import reference as la
from edgettt.quant import WEIGHT_FORMATS, QuantConfig, QuantLinear, quantize_, quantize_model, weight_format
from edgettt.calibration.statistics import Calibration, calibrate
from edgettt.formats.layouts import dequantize_int4, dequantize_int8, pack_nibbles, unpack_nibbles
from edgettt.quant.linear import QuantState
from edgettt.quant.weight_formats import Int8, WeightFormat

INT4, INT8 = weight_format("int4"), weight_format("int8")


@pytest.mark.parametrize("name", sorted(WEIGHT_FORMATS))
def test_every_registered_format_stores_what_it_declares_and_dequantizes_within_its_grid(name):
    """The checks every weight format passes (a new one gets them by being registered): the stored
    tensors are the declared shapes and dtypes (a quantized model is shaped by them before loading),
    the layer computes with the dequantized weight, the error is a fraction of the weights' scale,
    and the export reads tensors it was given."""
    fmt, group = WEIGHT_FORMATS[name], 64
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(11)) / 10
    t = fmt.quantize(w, group)
    declared = fmt.storage(48, 128, group)
    assert {k: (tuple(v.shape), v.dtype) for k, v in t.items()} == {k: (tuple(s), d) for k, (s, d) in declared.items()}
    d = fmt.dequantize(t, 48, 128, group)
    assert d.shape == w.shape and ((d - w).pow(2).mean() / w.pow(2).mean()).item() < 0.02
    layer = QuantLinear(128, 48, name, group, t)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(12))
    assert ((layer(x) - x @ d.T).norm() / (x @ d.T).norm()).item() < (0.02 if name == "bnb-int8" else 1e-5)
    exported = fmt.export_tensors(t)
    assert torch.allclose(fmt.export_matmul(x, exported, 128, 48, group), x @ d.T, rtol=1e-4, atol=1e-5)
    assert fmt.fits(128, group) and (fmt.fits(96, group) != fmt.grouped)
    ids = torch.tensor([[5, 0], [47, 5]])
    assert torch.equal(layer.rows(ids), d[ids])  # a tied embedding reads exactly the dequantized rows
    if fmt.exports_rows:
        assert torch.allclose(fmt.export_rows(ids, exported, 128, 48, group), d[ids], rtol=1e-6, atol=0)


@pytest.mark.parametrize("K", [128, 40])  # 40: padded to two blocks of 32
def test_int8_rows_in_the_8_bit_matmulnbits_layout_are_the_same_numbers(K):
    from edgettt.quant.weight_formats import INT8_BLOCK, int8_rows_as_nbits, nbits_weight

    w = torch.randn(24, K, generator=torch.Generator().manual_seed(3))
    t = INT8.quantize(w, 64)
    nbits = int8_rows_as_nbits(t["qweight"], t["scales"])
    blocks = -(-K // INT8_BLOCK)
    assert nbits["qweight"].shape == (24, blocks, INT8_BLOCK) and nbits["qweight"].dtype == torch.uint8
    assert torch.equal(nbits_weight(nbits["qweight"], nbits["scales"], nbits["zero_points"], K, 8), dequantize_int8(t))


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_a_quantized_tied_head_serves_the_embedding_from_its_own_bytes(trained, tmp_path, fmt):
    from edgettt.quant.linear import TiedEmbedding

    model = convert(trained[0], "parallel")
    quantize_model(model, QuantConfig(weights=fmt, group_size=32, skip=()))
    assert isinstance(model.model.embed_tokens, TiedEmbedding)
    assert "model.embed_tokens.weight" not in model.weights() and "lm_head.qweight" in model.weights()
    ids = torch.tensor([[3, 200, 7]])
    assert torch.equal(model.model.embed_tokens(ids), model.lm_head.dequantized()[ids])
    edgettt.save(model, tmp_path / "q")
    again = edgettt.load(tmp_path / "q")
    assert isinstance(again.model.embed_tokens, TiedEmbedding) and again.model.embed_tokens.head is again.lm_head
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))


def test_nibble_packing_round_trips_and_matches_the_matmulnbits_order():
    codes = torch.randint(0, 16, (5, 3, 64), generator=torch.Generator().manual_seed(0))
    packed = pack_nibbles(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 3, 32)
    assert torch.equal(unpack_nibbles(packed), codes.to(torch.uint8))
    assert pack_nibbles(torch.tensor([3, 12])).item() == 3 | (12 << 4)  # lower K index in the low nibble


def test_int4_layout_and_exact_round_trip_of_representable_weights():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(48, 192, generator=g)
    t = INT4.quantize(w, 64)
    assert t["qweight"].shape == (48, 3, 32) and t["scales"].shape == (48, 3) and t["zero_points"].shape == (48, 2)
    once = dequantize_int4(t)
    assert torch.allclose(dequantize_int4(INT4.quantize(once, 64)), once, atol=1e-5)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_rtn_error_is_within_the_uniform_rounding_bound(group):
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    t = INT4.quantize(w, group)
    err = (dequantize_int4(t) - w).reshape(64, -1, group)
    step = t["scales"][..., None]
    assert (err.abs() <= step / 2 + 1e-6).all()  # every weight within half a step
    # rounding error is close to uniform: mean square about step^2 / 12
    assert (err.pow(2).mean() / (step.pow(2).mean() / 12)).item() == pytest.approx(1.0, rel=0.15)


@pytest.mark.parametrize("group", [32, 128])
def test_int6_is_a_4_bit_and_a_2_bit_matmulnbits_part_with_a_sixteenth_of_int4s_error(group):
    """int6's codes 0..63 are kept as a 4-bit part on 4x the step and a 2-bit part on the step (MatMulNBits' 4- and
    2-bit layouts; ONNX Runtime itself reads them in tests/test_export.py): the two parts' weights add up to the
    dequantized one, every weight is within half a step, and 4x int4's levels leave about 1/16 of its squared
    error."""
    from edgettt.formats.layouts import dequantize_int6, pack_crumbs, unpack_crumbs
    from edgettt.quant.weight_formats import nbits_weight

    codes = torch.randint(0, 4, (5, 3, 16), generator=torch.Generator().manual_seed(7))
    assert torch.equal(unpack_crumbs(pack_crumbs(codes)), codes.to(torch.uint8))
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    INT6 = weight_format("int6")
    t = INT6.quantize(w, group)
    d = dequantize_int6(t)
    parts = [nbits_weight(p["qweight"], p["scales"], p["zero_points"], 256, bits)
             for p, bits in zip(INT6._parts(t), (4, 2))]
    assert torch.allclose(parts[0] + parts[1], d, atol=1e-6)
    err = (d - w).reshape(64, -1, group)
    assert (err.abs() <= t["scales"][..., None] / 2 + 1e-6).all()
    ratio = (err.pow(2).mean() / (dequantize_int4(INT4.quantize(w, group)) - w).pow(2).mean()).item()
    assert 1 / 20 < ratio < 1 / 12  # (15 / 63)^2 = 1 / 17.6


def test_int8_error_bound():
    w = torch.randn(32, 100, generator=torch.Generator().manual_seed(3))
    t = INT8.quantize(w, 64)
    assert t["qweight"].dtype == torch.int8
    assert ((dequantize_int8(t) - w).abs() <= t["scales"][:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_bitsandbytes_4bit_error_bound(quant_type):
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(4))
    t = weight_format(quant_type).quantize(w, 64)
    d = weight_format(quant_type).dequantize(t, 32, 128, 64)
    absmax = w.reshape(-1, 64).abs().amax(-1, keepdim=True)
    rel = ((d - w).reshape(-1, 64).abs() / absmax).max().item()
    assert rel < 0.25  # the widest gap of either 4-bit code book is under half of 0.5 absmax
    assert (d - w).pow(2).mean().item() / w.pow(2).mean().item() < 0.02


def test_gptq_beats_rounding_on_correlated_inputs():
    g = torch.Generator().manual_seed(5)
    X = torch.randn(4000, 128, generator=g) @ torch.randn(128, 128, generator=g) * 0.2
    w = torch.randn(64, 128, generator=g)
    H = X.T @ X / X.shape[0]
    out_err = lambda d: (X @ (d - w).T).pow(2).mean().item()  # noqa: E731
    feedback = Calibration("m", {}, 64, 1, 0, 100.0, {"layer": H}).feedback("layer")  # GPTQ on these statistics
    assert out_err(dequantize_int4(INT4.quantize(w, 64, feedback))) < 0.75 * out_err(dequantize_int4(INT4.quantize(w, 64)))
    assert out_err(dequantize_int8(INT8.quantize(w, 64, feedback))) < 0.75 * out_err(dequantize_int8(INT8.quantize(w, 64)))
    int6 = weight_format("int6")
    assert out_err(int6.dequantize(int6.quantize(w, 64, feedback), 64, 128, 64)) < 0.75 * out_err(
        int6.dequantize(int6.quantize(w, 64), 64, 128, 64))


@pytest.fixture(scope="module")
def trained():
    """The shipped TTT-Linear model, converted, calibrated at the context the tests run (2048)."""
    model = convert(edgettt.load("ttt-linear-tiny"), "exact")
    cal = calibrate(model, read_text("python-docs:train"), ctx=2048, samples=2)
    ids = torch.tensor([model.tokenizer.encode_bytes(read_text("python-docs:test").data[:2049])])
    return model, cal, ids


def kld(model, ref_logits, ids):
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1]).double(), -1)
    ref = torch.log_softmax(ref_logits.double(), -1)
    return (ref.exp() * (ref - logp)).sum(-1).mean().item()


def quantized(model, config, cal=None):
    """A quantized copy through the one call the CLI and the report use."""
    return edgettt.quantize(model, config, cal)


def test_gptq_beats_rtn_on_a_trained_model(trained):
    model, cal, ids = trained
    with torch.no_grad():
        ref = model(ids[:, :-1])
    rtn = kld(quantized(model, QuantConfig("int4", 64, "rtn")), ref, ids)
    gptq = kld(quantized(model, QuantConfig("int4", 64, "gptq"), cal), ref, ids)
    assert gptq < rtn


def test_int8_weights_barely_move_the_model(trained):
    model, cal, ids = trained
    with torch.no_grad():
        ref = model(ids[:, :-1])
    rtn = kld(quantized(model, QuantConfig("int8")), ref, ids)
    assert rtn < 0.005
    assert kld(quantized(model, QuantConfig("int8", method="gptq"), cal), ref, ids) < rtn


def test_quantized_state_error_stays_bounded_over_a_long_sequence(trained):
    """int8 state with calibrated scales, rounded at mini-batch boundaries only: the error stays
    under a fixed level over 2048 tokens (it does still grow along the text: about 6x from the first
    512 tokens to the last on this model, an open problem of the quantization issue)."""
    model, cal, ids = trained
    with torch.no_grad():
        ref = model(ids[:, :-1])
    q = quantized(model, QuantConfig("none", state="int8"), cal)
    with torch.no_grad():
        logp = torch.log_softmax(q(ids[:, :-1]).double(), -1)
    r = torch.log_softmax(ref.double(), -1)
    per_token = (r.exp() * (r - logp)).sum(-1)[0]
    first, last = per_token[:512].mean().item(), per_token[-512:].mean().item()
    assert per_token.mean().item() < 0.005 and last < 0.01 and first < 0.002
    uncalibrated = quantized(model, QuantConfig("none", state="int8-tensor"), cal)
    assert kld(uncalibrated, ref, ids) > 5 * per_token.mean().item()


def test_the_default_int8_state_drifts_far_less_and_stays_flat_along_the_text(trained):
    """The two-level int8 state (a step per row recomputed at every commit, 12 bits a value) against
    the calibrated 8-bit one on the same 2048 tokens: KLD far lower, in the last quarter as in the first
    (measured on this model: mean 1.7e-6 against 2.4e-3)."""
    model, cal, ids = trained
    with torch.no_grad():
        ref = model(ids[:, :-1])
    r = torch.log_softmax(ref.double(), -1)

    def per_token(state):
        with torch.no_grad():
            logp = torch.log_softmax(quantized(model, QuantConfig("none", state=state), cal)(ids[:, :-1]).double(), -1)
        return (r.exp() * (r - logp)).sum(-1)[0]

    two_level, calibrated = per_token("int12"), per_token("int8")
    assert 0 < two_level.mean() < calibrated.mean() / 20
    assert two_level[-512:].mean() < 1e-4


@pytest.mark.parametrize("split", [21, 32])  # inside a mini-batch, at a boundary (b = 16)
def test_the_int12_state_keeps_the_open_mini_batch_in_place_of_a(trained, split):
    """The int12 state keeps the open mini-batch's keys and values (float16, one slot a token) instead
    of the float32 sum A: the slots of the tokens seen hold values, the rest zeros; decode and prefill
    in pieces continue it as one prefill does (up to its run-time rounding), and
    the whole decode state is about a third of the float one's bytes (for each head, S (d+1) x d at 1.5 bytes
    a value plus a float32 step a row and b keys and values in float16, against S and A in float32)."""
    model, cal, ids = trained
    q = quantized(model, QuantConfig("none", state="int12"), cal)
    ids = ids[:, :70]
    b = q.config.mini_batch_size
    with torch.no_grad():
        full = q(ids)
        first, state = q.prefill(ids[:, :split])
        layer = state.layers[0]
        assert "A1" not in layer and layer["K1"].dtype == layer["V1"].dtype == torch.float16
        assert layer["K1"].shape[2] == layer["V1"].shape[2] == b
        filled = split % b
        assert (layer["K1"][:, :, filled:] == 0).all() and (layer["K1"][:, :, :filled].abs().sum(-1) > 0).all()
        pieces = [first]
        second, state = q.prefill(ids[:, split:split + 9], state)
        pieces.append(second)
        for t in range(split + 9, ids.shape[1]):
            step, state = q.step(ids[:, t], state)
            pieces.append(step[:, None])
    got = torch.cat(pieces, 1)
    assert ((got - full).norm() / full.norm()).item() < 1e-3  # measured 1e-5 to 1e-4
    d = model.config.head_dim
    per_head = 1.5 * (d + 1) * d + 4 * (d + 1) + 2 * b * (2 * d + 1), 8 * (d + 1) * d
    assert q.decode_state_bytes() / model.decode_state_bytes() == pytest.approx(per_head[0] / per_head[1], rel=0.02)


def test_the_int12_kv8_state_keeps_the_open_mini_batch_in_8_bits_at_a_quarter_of_the_float_bytes(trained):
    """int12's S with int8 keys (Hadamard-rotated, the constant feature exact) and values a slot: 25.9% of the float
    state's bytes on this model (int12: 31.9%), the drift a few times int12's over 2048 tokens and still small
    (measured 5e-5 against 4e-6), decode continuing a prefill as one prefill does up to the rounding."""
    model, cal, ids = trained
    with torch.no_grad():
        ref = model(ids[:, :-1])
    states = {name: quantized(model, QuantConfig("none", state=name), cal) for name in ("int12", "int12-kv8")}
    d, b = model.config.head_dim, model.config.mini_batch_size
    per_head = 1.5 * (d + 1) * d + 4 * (d + 1) + b * (d + 2) + b * (d + 2), 8 * (d + 1) * d
    q = states["int12-kv8"]
    assert q.decode_state_bytes() / model.decode_state_bytes() == pytest.approx(per_head[0] / per_head[1], rel=0.02)
    assert q.decode_state_bytes() / model.decode_state_bytes() <= 0.26
    with torch.no_grad():
        drift = {name: kld(m, ref, ids) for name, m in states.items()}
        full = q(ids[:, :70])
        first, state = q.prefill(ids[:, :21])
        pieces = [first] + [q.step(ids[:, t], state)[0][:, None] for t in range(21, 70)]
    assert drift["int12"] < drift["int12-kv8"] < 1e-3
    assert metrics.kld(full, torch.cat(pieces, 1)).mean() < 1e-4  # (a flipped rounding moves a token a little)


def test_8_bit_slots_round_within_half_a_step_and_rotated_keys_keep_their_constant():
    from edgettt.formats.state_formats import hadamard, int8_rotated_keys, int8_slots

    g = torch.Generator().manual_seed(0)
    for n in (64, 48):  # a power of two, and three blocks of 16
        H = hadamard(n, torch.float64)
        assert torch.allclose(H @ H.T, torch.eye(n, dtype=torch.float64))
    x = torch.randn(2, 4, 16, 64, generator=g) * torch.logspace(-3, 1, 64)  # features of every size
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((int8_slots(x) - x).abs() <= step / 2 * (1 + 1e-5)).all()
    keys = torch.cat((x, torch.ones(2, 4, 16, 1)), dim=-1)
    kept = int8_rotated_keys(keys)
    assert torch.equal(kept[..., -1], keys[..., -1])
    assert ((kept - keys)[..., :-1].norm(dim=-1) <= step[..., 0] / 2 * 64 ** 0.5 * (1 + 1e-4)).all()


def test_the_two_level_rounding_is_within_a_30th_of_the_row_step():
    """|S - round(S)| <= step / 30 with step = max |S - S0| over the row / 127 (nothing clipped), the row's
    largest change kept exactly, rows that did not move left at S0, and rounding twice changes nothing."""
    from edgettt.formats.state_formats import two_level_round

    g = torch.Generator().manual_seed(0)
    S0 = torch.randn(3, 17, 16, generator=g)
    d = torch.randn(2, 3, 17, 16, generator=g) * torch.logspace(-2, 2, 17)[:, None]  # rows of every magnitude
    d[0, 1, 5] = 0.0
    S = S0 + d
    kept = two_level_round(S, S0)
    step = d.abs().amax(-1, keepdim=True) / 127
    assert ((kept - S).abs() <= step / 30 * (1 + 1e-4) + 1e-6).all()
    assert torch.equal(kept[0, 1, 5], S0[1, 5])
    assert torch.allclose(two_level_round(kept, S0), kept, rtol=1e-5, atol=1e-6)
    moved = (step > 0).expand_as(S)
    errors = ((kept - S) / step)[moved]  # uniform on [-1/30, 1/30]: mean near 0, spread 1/30 / sqrt(3)
    assert errors.mean().abs() < 2e-3 and 0.015 < errors.std() < 0.0205


def test_chunked_prefill_with_a_quantized_state_equals_decode(trained):
    model, cal, ids = trained
    q = quantized(model, QuantConfig("int8", state="int8"), cal)
    ids = ids[:, :70]
    with torch.no_grad():
        full = q(ids)
        logits, state = q.prefill(ids[:, :21])
        outs = [logits]
        for t in range(21, ids.shape[1]):
            step, state = q.step(ids[:, t], state)
            outs.append(step[:, None])
    got = torch.cat(outs, 1)
    # the two paths differ in float rounding (~1e-7), which can flip a rare int8 rounding decision of
    # the state by one step; a state left unquantized on one path shows as ~5e-3
    assert ((got - full).norm() / full.norm()).item() < 1e-3


@pytest.mark.parametrize("start", [0, 3])
def test_requantized_chunk_equals_requantized_recurrence(start):
    g = torch.Generator().manual_seed(6)
    qa, ka, vh = (torch.randn(1, 2, 13, 5, generator=g) for _ in range(3))
    S, eta = torch.randn(1, 2, 5, 5, generator=g), torch.rand(4, generator=g) + 0.1
    A = torch.randn(1, 2, 5, 5, generator=g) * (start > 0)
    requant = lambda s, pos: torch.round(s * (16 + pos)) / (16 + pos)  # noqa: E731 (steps depend on the position)
    a = la.chunk(qa, ka, vh, S, A, eta, start, requant)
    b = la.recurrent(qa, ka, vh, S, A, eta, start, requant)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, atol=1e-5)


# a TTT-Linear of the 1.9M models' widths (two layers): input sizes that groups of 128 divide (512) and do not (192)
HIDDEN_192 = dict(vocab_size=256, hidden_size=192, intermediate_size=512)


def test_bad_configs(tiny_model):
    with pytest.raises(EdgetttError, match="gptq applies to --weights int8, int4 and int6 only"):
        QuantConfig("nf4", method="gptq")
    model = convert(tiny_model("linear", **HIDDEN_192), "exact")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(EdgetttError, match=r"cannot take 12 layers.*q_proj \(K=192\)"):
        quantize_(model, QuantConfig("int4", 128, fallback="refuse"))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # refused before any layer
    with pytest.raises(EdgetttError, match="needs input statistics"):
        quantize_(model, QuantConfig("int4", 64, "gptq"))


@pytest.mark.parametrize("fallback", ["int8", "float"])
def test_layers_a_format_cannot_take_fall_back_per_layer_and_load_again(tmp_path, fallback, tiny_model):
    """int4 in groups of 128 cannot take layers of input size 192 (all but down_proj, which reads 512):
    they go to the fallback, down_proj to int4; the choice is recorded per layer, and the saved model
    loads with the same formats."""
    model = convert(tiny_model("linear", **HIDDEN_192), "exact")
    config = QuantConfig("int4", 128, fallback=fallback)
    rows = {r["name"]: r for r in quantize_model(model, config)}  # weights, state, the recorded config
    up, down = "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"
    assert rows[up]["format"] == fallback and rows[up]["fallback"]
    assert rows[down]["format"] == "int4" and not rows[down]["fallback"]
    assert config.overrides[up] == fallback and down not in config.overrides
    assert model.config.quantization["overrides"] == config.overrides
    edgettt.save(model, tmp_path / "q")
    again = edgettt.load(tmp_path / "q")
    for name in (up, down):  # the same layer, as its `QuantState` says (none: float)
        assert getattr(again.get_submodule(name), "quant_state", None) == getattr(model.get_submodule(name),
                                                                                 "quant_state", None)
    assert again.get_submodule(down).quant_state == QuantState("int4", 128, 512, 192)
    ids = torch.randint(0, 256, (1, 40))
    assert torch.allclose(again(ids), model(ids), atol=1e-5)


def test_missing_bitsandbytes_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_bnb(name, *args, **kwargs):
        if name.startswith("bitsandbytes"):
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bnb)
    with pytest.raises(EdgetttError, match="bitsandbytes is not installed .*pip install bitsandbytes"):
        weight_format("nf4").quantize(torch.randn(4, 64), 64)


def test_llm_int8_through_bitsandbytes_keeps_outlier_columns_accurate():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(48, 128, generator=g) / 10
    x = torch.randn(2, 5, 128, generator=g)
    x[..., 7] = 40.0  # an outlier feature: above the threshold, it goes through fp16
    t = weight_format("bnb-int8").quantize(w, 64)
    assert t["qweight"].dtype == torch.int8 and t["scb"].shape == (48,)
    y = QuantLinear(128, 48, "bnb-int8", 64, t)(x)
    exact = x @ w.T
    assert y.shape == (2, 5, 48)
    assert ((y - exact).norm() / exact.norm()).item() < 0.02


def test_int8_state_scales_follow_the_position_bucket(trained):
    """Calibrated scales per position bucket, never shrinking along the text; the layer rounds each
    commit with the scales of the bucket its position falls in (the last bucket beyond)."""
    model, cal, _ = trained
    table = cal.layer_scales(0)[0]  # [buckets, H, Dk]
    assert table.dim() == 3 and table.shape[0] > 1 and (table[1:] >= table[:-1]).all()
    assert (table[0] < table[-1]).float().mean() > 0.5  # S - S0 grows along the text: finer steps early
    q = quantized(model, QuantConfig("none", state="int8"), cal)
    mixer = q.model.layers[0].seq_modeling_block
    span = cal.bucket_tokens
    assert torch.equal(mixer.state_scale(1, 0), table[0]) and torch.equal(mixer.state_scale(1, span), table[1])
    assert torch.equal(mixer.state_scale(1, 100 * span), table[-1])
    assert torch.equal(mixer.state_scale(1, torch.tensor(span + 16)), table[1])


def test_a_calibration_keeps_the_bucket_span_it_was_made_with(trained, tmp_path):
    """The bucket span comes from the file's tables, not from today's bucket count."""
    _, cal, _ = trained
    buckets = cal.layer_scales(0)[0].shape[0]
    assert cal.bucket_tokens == cal.seq_len // buckets
    halved = {k: v[::2].contiguous() for k, v in cal.state_scales.items()}  # as if made with half the buckets
    cal.save(tmp_path / "cal.st")
    old = Calibration.load(tmp_path / "cal.st")
    old.state_scales = halved
    assert old.bucket_tokens == 2 * cal.bucket_tokens


def test_bitsandbytes_imports_without_remarks_on_stderr():
    """Its CPU backend logs a warning about an optional `kernels` package at import on some CPUs."""
    import subprocess
    import sys

    code = "from edgettt.quant.weight_formats import bitsandbytes; bitsandbytes()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "kernels" not in result.stderr and result.stderr.strip() == ""


class _Int8PerTensor(WeightFormat):
    """A format written only here: one int8 scale for the whole matrix (what adding a format takes)."""

    name = "int8-tensor-test"

    def quantize(self, w, group, method="rtn", hessian=None):
        scale = w.abs().max().clamp_min(1e-12) / 127
        return {"qweight": torch.round(w / scale).clamp(-127, 127).to(torch.int8), "scale": scale.reshape(1).float()}

    def storage(self, N, K, group):
        return {"qweight": ((N, K), torch.int8), "scale": ((1,), torch.float32)}

    def dequantize(self, t, N, K, group):
        return t["qweight"].float() * t["scale"]

    def export_tensors(self, t):
        N = t["qweight"].shape[0]
        return {"qweight_t": t["qweight"].T.contiguous(), "scales": t["scale"].expand(N).contiguous()}

    export_matmul = Int8.export_matmul


def test_a_format_added_to_the_registry_alone_goes_through_every_command(tmp_path, monkeypatch):
    """The design notes' promise: a new weight format is one class in the registry. Registered here
    and nowhere else, it is quantized by the CLI, saved, loaded with its tensors, counted, and named
    in the report's variants."""
    from click.testing import CliRunner

    from edgettt.cli import cli
    from edgettt.quant.apply import weight_bits
    from edgettt.reporting import variants

    fmt = _Int8PerTensor()
    monkeypatch.setitem(WEIGHT_FORMATS, fmt.name, fmt)
    edgettt.save(convert(edgettt.load("ttt-linear-tiny"), "exact"), tmp_path / "la")
    result = CliRunner().invoke(cli, ["quantize", str(tmp_path / "la"), str(tmp_path / "q"), "--weights", fmt.name])
    assert result.exit_code == 0, result.output
    model, again = edgettt.load(tmp_path / "la"), edgettt.load(tmp_path / "q")
    layer = again.get_submodule("model.layers.0.mlp.up_proj")
    assert isinstance(layer, QuantLinear) and layer.format is fmt and layer.scale.shape == (1,)
    assert 7 < weight_bits(again)["bits_per_weight"] < weight_bits(model)["bits_per_weight"]
    ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref, got = model(ids), again(ids)
    assert 0 < ((got - ref).norm() / ref.norm()).item() < 0.05
    assert [v.name for v in variants([fmt.name], [])] == [f"w-{fmt.name} s-fp32"]


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_int8_activations_cost_a_little_in_prefill_and_touch_decode_only_when_asked(trained, weights):
    """set_activations(model, "int8"): the prefill's GEMMs round the activations to int8 a row (W8A8 /
    W4A8, the CUDA kernels' arithmetic; here their references); the KLD it adds to the weights' own is
    small (shipped ttt-linear-tiny-parallel, int8 weights: 6e-5 -> 5.1e-4, benchmarks/results/int8_activations_accuracy.md).
    A decode step (GEMV rows) stays weight-only, bit for bit; with `decode=True` int4 layers round x in
    blocks of 32 there (the W4A8 GEMV), a small change of the step's logits, and int8 layers stay as they are."""
    from edgettt.quant import set_activations

    model, _, ids = trained
    with torch.no_grad():
        ref = model(ids[:, :-1])  # 2,048 rows: int4's W4A8 GEMM starts there (kernels.INT4_A8_MIN_ROWS)
    q = quantized(model, QuantConfig(weights, 64))
    weight_only = kld(q, ref, ids)
    with torch.no_grad():  # 8 tokens, then one: GEMV rows
        float_logits = q.step(ids[:, 8], q.prefill(ids[:, :8])[1])[0]
    assert set_activations(q, "int8") == sum(isinstance(m, QuantLinear) for m in q.modules())
    with_int8 = kld(q, ref, ids)
    assert weight_only < with_int8 < weight_only + (0.01 if weights == "int8" else 0.03)
    with torch.no_grad():
        assert torch.equal(q.step(ids[:, 8], q.prefill(ids[:, :8])[1])[0], float_logits)
        set_activations(q, "int8", decode=True)
        step_logits = q.step(ids[:, 8], q.prefill(ids[:, :8])[1])[0]
    if weights == "int8":
        assert torch.equal(step_logits, float_logits)
    else:
        assert 0 < ((step_logits - float_logits).norm() / float_logits.norm()).item() < 0.02
    with pytest.raises(ValueError):
        set_activations(q, "int4")


@pytest.mark.parametrize("name, decode, weight_only_rows, a8_rows", [
    ("int8", False, [1, 8], [9]), ("int4", False, [1, 8, 9, 2047], [2048]), ("int4", True, [9, 2047], [1, 8, 2048])])
def test_int8_activations_start_at_each_formats_row_count(name, decode, weight_only_rows, a8_rows):
    """A layer asked for int8 activations rounds them only in products of the rows where that is the faster
    kernel: int8 above the GEMV range (9 rows on); int4 from 2,048 rows (below, its W4A8 way requantizes the
    whole weight every call and was measured at half the speed of weight-only at 16-128 rows), and in the
    GEMV range when asked for (`decode_a8`: its W4A8 GEMV, dp4a). Elsewhere the product is the weight-only
    one, bit for bit; where it rounds, the rounding shows."""
    from edgettt.ops.common import GEMV_MAX_ROWS, INT4_A8_MIN_ROWS

    assert (GEMV_MAX_ROWS, INT4_A8_MIN_ROWS) == (8, 2048)
    fmt = weight_format(name)
    t = fmt.quantize(torch.randn(48, 128, generator=torch.Generator().manual_seed(4)) / 10, 64)
    layer = QuantLinear(128, 48, name, 64, t)
    x = torch.randn(max(weight_only_rows + a8_rows), 128, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for rows in weight_only_rows + a8_rows:
            layer.activations = "float"
            weight_only = layer(x[:rows])
            layer.activations, layer.decode_a8 = "int8", decode
            got = layer(x[:rows])
            if rows in weight_only_rows:
                assert torch.equal(got, weight_only), rows
            else:
                assert 0 < ((got - weight_only).norm() / weight_only.norm()).item() < 0.02, rows


def test_a_quant_state_saves_and_loads_itself_and_makes_the_layer_its_tensors_load_into():
    """`QuantState` (bitsandbytes' QuantState for edgettt's formats): as a dict and back, and the empty layer
    a saved layer's tensors load into computes as the layer did."""
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(0))
    layer = QuantLinear(128, 48, "int4", 64, weight_format("int4").quantize(w, 64))
    again = QuantState.from_dict(json.loads(json.dumps(layer.quant_state.as_dict())))
    assert again == layer.quant_state == QuantState("int4", 64, 128, 48)
    empty = again.empty_layer()
    empty.load_state_dict(layer.state_dict(), assign=True)
    x = torch.randn(3, 128)
    assert torch.equal(empty(x), layer(x))


@pytest.mark.parametrize("raw", [{"format": "int4", "group_size": 64, "in_features": 128},
                                 {"format": "int5", "group_size": 64, "in_features": 128, "out_features": 48},
                                 {"format": "int4", "group_size": 0, "in_features": 128, "out_features": 48},
                                 {"format": "int4", "group_size": True, "in_features": 128, "out_features": 48},
                                 ["int4", 64, 128, 48]])
def test_a_malformed_quant_state_is_a_one_line_error(raw):
    with pytest.raises(EdgetttError, match="quantize the model again"):
        QuantState.from_dict(raw, "m/config.json")
