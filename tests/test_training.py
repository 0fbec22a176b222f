"""Training through the TTT layers: every parameter, the initial fast weights included, gets the
gradient of the loss (ttt-lm-pytorch trains W1, b1 (W2, b2) by backpropagating through the inner loop)."""

import shutil

import pytest
import torch

from edgettt import convert


@pytest.mark.parametrize("family", ["linear", "mlp"])
@pytest.mark.parametrize("form", ["ttt", "exact", "parallel"])
def test_initial_fast_weights_get_the_gradient(tiny_model, family, form):
    model = tiny_model(family, seed=3)
    model = model if form == "ttt" else convert(model, form)
    model.double()
    ids = torch.randint(0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    loss = lambda: model(ids).logsumexp(-1).mean()  # noqa: E731
    loss().backward()
    layer = model.model.layers[0].seq_modeling_block
    name = "W1" if form == "ttt" else ("state0_1" if family == "mlp" else "state0")
    weight = getattr(layer, name)
    assert weight.grad is not None and weight.grad.abs().max() > 0, name
    # the gradient along a random unit direction against a central finite difference (a step of 1e-2:
    # parts of the model round to fp32, so smaller steps drown in rounding)
    direction = torch.randn(weight.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    direction /= direction.norm()
    eps = 1e-2
    with torch.no_grad():
        weight += eps * direction
        up = loss()
        weight -= 2 * eps * direction
        down = loss()
        weight += eps * direction
    numeric = (up - down) / (2 * eps)
    analytic = (weight.grad * direction).sum()
    assert torch.isclose(analytic.double(), numeric.double(), rtol=2e-3, atol=1e-7), (analytic.item(), numeric.item())


def test_gelu_tanh_grad_backward_matches_autograd_through_its_formula():
    from edgettt import ops

    x = torch.linspace(-6, 6, 301, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ops._GeluTanhGrad.apply, (x,))
    (by_hand,) = torch.autograd.grad(ops.gelu_tanh_grad(x).sum(), x)
    (through_formula,) = torch.autograd.grad(ops._gelu_tanh_grad(x).sum(), x)
    assert torch.allclose(by_hand, through_formula, rtol=1e-12, atol=1e-12)
    assert torch.equal(ops.gelu_tanh_grad(x.detach()), ops._gelu_tanh_grad(x.detach()))


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("clang++")), reason="inductor needs a C++ compiler on a CPU")
def test_compiled_mini_batch_steps_train_the_same(tiny_model, monkeypatch):
    """compile_ttt_steps (recipes/train_tiny.py --compile): the same loss and gradients."""
    from edgettt.families.ttt.kernels import compile_ttt_steps
    from edgettt.families.ttt.original import TTTLayer

    model = tiny_model("mlp", seed=5)
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))

    def loss_and_grads():
        model.zero_grad()
        loss = model(ids).logsumexp(-1).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    eager_loss, eager_grads = loss_and_grads()
    for name in ("_linear_step", "_mlp_step"):  # restored after the test
        monkeypatch.setattr(TTTLayer, name, getattr(TTTLayer, name))
    compile_ttt_steps()
    loss, grads = loss_and_grads()
    assert torch.allclose(loss, eager_loss, rtol=1e-5)
    for g, e in zip(grads, eager_grads):
        assert torch.allclose(g, e, rtol=1e-4, atol=1e-6)
