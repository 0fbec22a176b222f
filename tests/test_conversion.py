"""Conversion against the original TTT computation (DESIGN 3-4), on random models of both families."""

import pytest
import torch

from conftest import ALL_OPTIONS, FP32_EXACT, option_id, rel_err
import edgettt
from edgettt import convert, load
from edgettt.ops.linear_attention import reference as la

B_MINI = 8
LENGTHS = [1, 7, B_MINI, 3 * B_MINI + 5, 200]


@pytest.mark.parametrize("family", ["linear", "mlp"])
@pytest.mark.parametrize("options", ALL_OPTIONS, ids=option_id)
@torch.no_grad()
def test_exact_form_equals_reference(tiny_model, family, options):
    model = tiny_model(family, seed=3, mini_batch_size=B_MINI, **options)
    exact = convert(model, "exact")
    gen = torch.Generator().manual_seed(0)
    for T in LENGTHS:
        ids = torch.randint(0, model.config.vocab_size, (2, T), generator=gen)
        assert rel_err(exact(ids), model(ids)) < FP32_EXACT, T


def decode_all(model, ids, prefill_len):
    """Prefill the first `prefill_len` tokens (none: a fresh state), then decode the rest one by one."""
    if prefill_len:
        logits, state = model.prefill(ids[:, :prefill_len])
        outs = [logits]
    else:
        state, outs = model.init_state(ids.shape[0]), []
    for t in range(prefill_len, ids.shape[1]):
        logits, state = model.step(ids[:, t], state)
        outs.append(logits[:, None])
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("family", ["linear", "mlp"])
@pytest.mark.parametrize("form", ["ttt", "exact", "parallel"])
@pytest.mark.parametrize("options", [ALL_OPTIONS[0], ALL_OPTIONS[-1], ALL_OPTIONS[6]], ids=option_id)
@torch.no_grad()
def test_decode_equals_prefill(tiny_model, family, form, options):
    model = tiny_model(family, seed=5, mini_batch_size=B_MINI, **options)
    if form != "ttt":
        model = convert(model, form)
    ids = torch.randint(0, model.config.vocab_size, (3, 3 * B_MINI + 5), generator=torch.Generator().manual_seed(1))
    full = model(ids)
    for prefill_len in [0, 1, 5, B_MINI, B_MINI + 3, 2 * B_MINI]:
        assert rel_err(decode_all(model, ids, prefill_len), full) < FP32_EXACT, prefill_len


@pytest.mark.parametrize("family", ["linear", "mlp"])
@torch.no_grad()
def test_prefill_continues_from_any_state(tiny_model, family):
    """Prefill in pieces that cut mini-batches anywhere equals one prefill."""
    model = convert(tiny_model(family, seed=2, mini_batch_size=B_MINI, share_qk=True, pre_conv=True), "exact")
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(2))
    full = model(ids)
    state, outs, start = None, [], 0
    for cut in [3, 11, 16, 29, 40]:
        logits, state = model.prefill(ids[:, start:cut], state)
        outs.append(logits)
        start = cut
    assert rel_err(torch.cat(outs, dim=1), full) < FP32_EXACT


@pytest.mark.parametrize("family", ["linear", "mlp"])
@torch.no_grad()
def test_parallel_chunked_equals_whole_sequence_matrix_form(tiny_model, family, monkeypatch):
    """Qa S0 + ((Qa Ka^T) * M) Vh computed whole (naive) equals the chunked computation."""
    model = convert(tiny_model(family, seed=7, mini_batch_size=B_MINI, use_gate=True), "parallel")
    ids = torch.randint(0, model.config.vocab_size, (2, 3 * B_MINI + 5), generator=torch.Generator().manual_seed(3))
    chunked = model(ids)
    monkeypatch.setattr(la, "chunk", la.naive)
    assert rel_err(model(ids), chunked) < FP32_EXACT


@pytest.mark.parametrize("family", ["linear", "mlp"])
@torch.no_grad()
def test_parallel_equals_reference_when_learning_rates_are_zero(tiny_model, family):
    model = tiny_model(family, seed=8, mini_batch_size=B_MINI, ttt_base_lr=0.0, pre_conv=True)
    ids = torch.randint(0, model.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(4))
    assert rel_err(convert(model, "parallel")(ids), model(ids)) < FP32_EXACT


@pytest.mark.parametrize("family", ["linear", "mlp"])
@torch.no_grad()
def test_parallel_form_changes_the_function(tiny_model, family):
    """With non-zero learning rates the parallel form is a different model (its drift is reported)."""
    model = tiny_model(family, seed=9, mini_batch_size=B_MINI)
    ids = torch.randint(0, model.config.vocab_size, (2, 3 * B_MINI), generator=torch.Generator().manual_seed(5))
    assert rel_err(convert(model, "parallel")(ids), model(ids)) > 1e-3


@pytest.mark.parametrize("family", ["linear", "mlp"])
@pytest.mark.parametrize("form", ["exact", "parallel"])
@torch.no_grad()
def test_converted_model_saves_and_loads_back(tiny_model, tmp_path, family, form):
    converted = convert(tiny_model(family, seed=4, share_qk=True, tie_word_embeddings=False), form)
    edgettt.save(converted, tmp_path / "m")
    loaded = load(tmp_path / "m")
    assert loaded.form == form
    ids = torch.randint(0, converted.config.vocab_size, (1, 21))
    assert torch.equal(loaded(ids), converted(ids))
    # converting between the two forms keeps the weights
    other = convert(loaded, "parallel" if form == "exact" else "exact")
    assert rel_err(convert(other, form)(ids), converted(ids)) == 0


@pytest.mark.parametrize("family", ["linear", "mlp"])
@pytest.mark.parametrize("options", [ALL_OPTIONS[0], ALL_OPTIONS[-1]], ids=option_id)
@torch.no_grad()
def test_a_decayed_parallel_form_decodes_and_prefills_in_pieces_as_one_prefill(tiny_model, family, options):
    model = convert(tiny_model(family, seed=5, mini_batch_size=B_MINI, **options), "parallel", decay=0.8)
    ids = torch.randint(0, model.config.vocab_size, (2, 3 * B_MINI + 5), generator=torch.Generator().manual_seed(1))
    full = model(ids)
    for prefill_len in [0, 5, B_MINI, 2 * B_MINI + 3]:
        assert rel_err(decode_all(model, ids, prefill_len), full) < FP32_EXACT, prefill_len
    state, outs, start = None, [], 0
    for cut in [3, 11, 16, 29]:
        logits, state = model.prefill(ids[:, start:cut], state)
        outs.append(logits)
        start = cut
    assert rel_err(torch.cat(outs, dim=1), full) < FP32_EXACT
    # converting again keeps the decay; the decay changes the function; at gamma = 1 it is the plain parallel form
    assert rel_err(convert(model, "parallel")(ids), full) == 0
    assert rel_err(convert(tiny_model(family, seed=5, mini_batch_size=B_MINI, **options), "parallel")(ids), full) > 1e-4
    for layer in model.model.layers:
        layer.seq_modeling_block.decay_logit.data.fill_(-30.0)  # gamma = exp(-exp(-30)): 1 to float precision
    assert rel_err(model(ids), convert(tiny_model(family, seed=5, mini_batch_size=B_MINI, **options), "parallel")(ids)) < FP32_EXACT


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["linear", "mlp"])
@pytest.mark.parametrize("state_format", ["fp32", "int12"])
@torch.no_grad()
def test_a_decayed_model_on_cuda_computes_what_it_computes_on_the_cpu(tiny_model, family, state_format):
    """On CUDA a decayed TTT-Linear layer prefills through the parallel kernel with the decay, and decodes (and
    commits the int12 state) on the torch paths, whose kernels know no decay: either way it equals its CPU self
    (a kernel that dropped the decay would not)."""
    from edgettt.quant import apply_state_format

    model = convert(tiny_model(family, seed=5, mini_batch_size=B_MINI), "parallel", decay=0.8)
    apply_state_format(model, state_format)
    ids = torch.randint(0, model.config.vocab_size, (2, 3 * B_MINI + 5), generator=torch.Generator().manual_seed(1))
    on_cpu = model(ids), decode_all(model, ids, B_MINI + 3)
    model = model.cuda()
    on_cuda = model(ids.cuda()).cpu(), decode_all(model, ids.cuda(), B_MINI + 3).cpu()
    for cpu, cuda in zip(on_cpu, on_cuda):
        assert rel_err(cuda, cpu) < 1e-4


@torch.no_grad()
def test_a_decayed_model_saves_loads_and_refuses_other_forms(tiny_model, tmp_path):
    model = convert(tiny_model("linear", seed=4), "parallel", decay=0.9)
    model.model.layers[0].seq_modeling_block.decay_logit.data[0] = 1.0  # a tuned head: saved as it is
    edgettt.save(model, tmp_path / "m")
    loaded = load(tmp_path / "m")
    assert loaded.config.state_decay and '"state_decay": true' in (tmp_path / "m" / "config.json").read_text()
    ids = torch.randint(0, model.config.vocab_size, (1, 40))
    assert torch.equal(loaded(ids), model(ids))
    gamma = loaded.model.layers[0].seq_modeling_block.decay(1).gamma
    assert gamma[0] == torch.exp(-torch.exp(torch.tensor(1.0))) and torch.allclose(gamma[1:], torch.tensor(0.9))
    with pytest.raises(edgettt.EdgetttError, match="has no decay"):
        convert(loaded, "exact")
    for bad_form, bad_decay in (("exact", 0.9), ("parallel", 1.0), ("parallel", 0.0)):
        with pytest.raises(edgettt.EdgetttError, match="decay"):
            convert(tiny_model("linear", seed=4), bad_form, decay=bad_decay)


def test_converted_layer_has_no_inner_gradient_parameters(tiny_model):
    names = set(convert(tiny_model("mlp"), "exact").state_dict())
    assert not any(n.endswith(("W1", "b1", "W2", "b2", "learnable_token_idx")) for n in names)
    assert "model.layers.0.seq_modeling_block.state0_1" in names
    assert "model.layers.0.seq_modeling_block.mask_eta" in names


@pytest.mark.parametrize("weights", ["none", "int8", "int4"])
def test_fused_input_projections_compute_what_the_separate_ones_do(weights):
    """`fuse_input_projections(model, stacked_projection)` (what `bench --device cuda` runs): q/k/v and
    gate/up as one product each, float or quantized (rows stacked), give the model's logits in prefill
    and decode."""
    import copy

    import edgettt
    from edgettt.families.base import fuse_input_projections
    from edgettt.quant import QuantConfig, stacked_projection

    model = edgettt.load("ttt-linear-tiny-parallel")
    if weights != "none":
        model = edgettt.quantize(model, QuantConfig(weights, 64))
    fused = copy.deepcopy(model)
    assert fuse_input_projections(fused, stacked_projection) == 2 * len(model.model.layers)
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for m in (model, fused):
            logits, state = m.prefill(ids[:, :33])
            m.outputs = [logits, m.step(ids[:, 33], state)[0]]
    for a, b in zip(model.outputs, fused.outputs):
        assert (a - b).abs().max() <= 1e-4 * a.abs().max()
