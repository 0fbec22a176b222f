"""Distillation wins back part of the parallel form's drift."""

import torch

from edgettt import convert
from edgettt.distill import distill, kl_loss
from edgettt.metrics import drift


def test_kl_loss_is_zero_for_equal_logits_and_positive_otherwise():
    a = torch.randn(2, 5, 7)
    assert kl_loss(a, a).abs() < 1e-6 and kl_loss(a, a.flip(-1)) > 0


def test_distillation_reduces_kld_on_held_out_text(tiny_model):
    teacher = tiny_model("linear", seed=11, vocab_size=256, mini_batch_size=4)
    student = convert(teacher, "parallel")
    gen = torch.Generator().manual_seed(0)
    train = torch.randint(0, 256, (4000,), generator=gen).tolist()
    held_out = torch.randint(0, 256, (4, 33), generator=gen)
    with torch.no_grad():
        ref = teacher(held_out[:, :-1])
        before = drift(ref, student(held_out[:, :-1]), held_out[:, 1:])["kld_mean"]
    losses = distill(teacher, student, train, steps=100, batch=8, ctx=32, lr=1e-3, device="cpu")
    with torch.no_grad():
        after = drift(ref, student(held_out[:, :-1]), held_out[:, 1:])["kld_mean"]
    assert sum(losses[-5:]) < sum(losses[:5])
    assert after < 0.85 * before
