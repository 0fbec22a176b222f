"""The exact-form layer with a backward (ops/linear_attention/train.py) against torch autograd through exact_ref."""

import pytest
import torch
from conftest import rel_err
from test_prefill import layer_inputs

from edgettt.fast_paths import use_kernels
from edgettt.ops.linear_attention.prefill import exact_ref
from edgettt.ops.linear_attention.train import exact_train

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
NAMES = ("q", "k", "v", "lr", "S0", "gamma", "beta", "eta_tok")


def grads(fn, inputs, dout):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)[0]
    out.backward(dout)
    return out.detach(), [x.grad for x in leaves]


def check(B, H, T, d, b, dtype, device, tol, layout="bhtd"):
    inputs = list(layer_inputs(B, H, T, d, b, dtype, device, layout=layout))
    dout = torch.randn(B, H, T, d, generator=torch.Generator().manual_seed(5)).to(device=device, dtype=dtype)
    out_ref, grads_ref = grads(lambda *x: exact_ref(*(t.float() for t in x)), inputs, dout.float())
    out, grads_kernel = grads(exact_train, inputs, dout)
    assert rel_err(out.float(), out_ref) < tol, "out"
    for name, g, g_ref in zip(NAMES, grads_kernel, grads_ref):
        assert g.shape == g_ref.shape and not torch.isnan(g).any(), name
        assert rel_err(g.float(), g_ref) < tol, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,d,b", [(48, 16, 16), (24, 12, 8)])  # d of 12 pads; a mini-batch of 8 pads the tile
def test_exact_train_gradients_match_autograd(device, T, d, b):
    check(2, 2, T, d, b, torch.float32, device, 1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_exact_train_gradients_strided_half(device):
    """q, k, v as the model makes them ([B, T, H, d] memory), fp16."""
    check(1, 2, 32, 16, 16, torch.float16, device, 1e-2, layout="bthd")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_exact_train_training_shape_on_gpu():
    """The tiny models' training shape: d = 48, b = 16, T = 512."""
    check(4, 4, 512, 48, 16, torch.float32, "cuda", 1e-3, layout="bthd")


def test_training_a_ttt_linear_model_through_the_kernel_equals_the_loop(tiny_model, monkeypatch):
    """The original TTT-Linear model, loss and every parameter's gradient: kernel path against the loop."""

    device = DEVICES[0]
    model = tiny_model("linear", seed=5, mini_batch_size=8).to(device)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(2)).to(device)

    def loss_and_grads(kernels: bool):
        if kernels:
            assert use_kernels(model) == model.config.num_hidden_layers
        calls = []
        import edgettt.ops.linear_attention.train as train

        original = train.exact_train
        monkeypatch.setattr(train, "exact_train", lambda *a: calls.append(1) or original(*a))
        model.zero_grad()
        loss = model(ids).logsumexp(-1).mean()
        loss.backward()
        assert bool(calls) == kernels
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss_loop, grads_loop = loss_and_grads(False)
    loss_kernel, grads_kernel = loss_and_grads(True)
    assert rel_err(loss_kernel, loss_loop) < 1e-5
    for name, g in grads_loop.items():
        assert rel_err(grads_kernel[name], g) < 1e-4, name


def test_inference_of_a_ttt_linear_model_through_the_kernel_equals_the_loop(tiny_model, monkeypatch):
    """Without gradients too (a distillation's teacher): the prefill's logits and the decode step after it."""
    device = DEVICES[0]
    model = tiny_model("linear", seed=6, mini_batch_size=8).to(device)
    ids = torch.randint(0, model.config.vocab_size, (2, 25), generator=torch.Generator().manual_seed(3)).to(device)

    import edgettt.ops.linear_attention.train as train

    original = train.exact_train

    def prefill_then_step(kernels: bool):
        if kernels:
            use_kernels(model)
        calls = []
        monkeypatch.setattr(train, "exact_train", lambda *a: calls.append(1) or original(*a))
        with torch.no_grad():
            logits, state = model.prefill(ids[:, :24])
            last, _ = model.step(ids[:, 24], state)
        assert len(calls) == (model.config.num_hidden_layers if kernels else 0)  # the prefill's, not the step's
        return logits, last

    for loop, kernel in zip(prefill_then_step(False), prefill_then_step(True)):
        assert rel_err(kernel, loop) < 1e-5
