"""Distillation wins back part of the parallel form's drift."""

import pytest
import torch

from edgettt import convert
from edgettt.distill import distill, kl_loss, next_token_loss
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


def test_next_token_loss_is_the_cross_entropy_of_each_position_against_the_next():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]]))
    ids = torch.tensor([[2, 1, 0]])  # position 0 predicts 1 (p 0.25), position 1 predicts 0 (p 0.1)
    expected = -(torch.log(torch.tensor(0.25)) + torch.log(torch.tensor(0.1))) / 2
    assert torch.allclose(next_token_loss(logits, ids), expected)


def test_hard_weight_one_trains_on_the_text_alone(tiny_model):
    """With hard_weight 1 the teacher no longer matters: two different teachers give the same student."""
    train = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(1)).tolist()
    model = lambda seed: tiny_model("linear", seed=seed, vocab_size=256, mini_batch_size=4)  # noqa: E731

    def tuned(teacher_seed, hard_weight):
        student = convert(model(11), "parallel")
        distill(model(teacher_seed), student, train, steps=3, batch=4, ctx=16, device="cpu", hard_weight=hard_weight)
        return student

    students = [tuned(11, 1.0), tuned(12, 1.0)]
    mixed = tuned(12, 0.5)
    pairs = lambda a, b: zip(a.parameters(), b.parameters())  # noqa: E731
    assert all(torch.equal(p, q) for p, q in pairs(*students))
    assert not all(torch.equal(p, q) for p, q in pairs(students[0], mixed))


def test_minutes_end_the_distillation_early(tiny_model, monkeypatch):
    """With `minutes` the run stops when the clock says so (a fake clock: 1 s a step, 3 s allowed)."""
    teacher = tiny_model("linear", seed=11, vocab_size=256, mini_batch_size=4)
    student = convert(teacher, "parallel")
    clock = iter(range(1000))
    monkeypatch.setattr("edgettt.distill.time.monotonic", lambda: next(clock))
    train = torch.randint(0, 256, (500,), generator=torch.Generator().manual_seed(1)).tolist()
    losses = distill(teacher, student, train, steps=50, batch=2, ctx=8, device="cpu", minutes=3 / 60)
    assert len(losses) == 2  # clock reads 0 at the start, 1 and 2 before steps 0 and 1, 3 (the end) before step 2


def test_window_plan_mixes_lengths_at_equal_tokens_a_step():
    from edgettt.distill import window_plan

    assert window_plan(512, 8, 10_000) == [(512, 8)]
    assert window_plan([2048, 512, 8192], 2, 100_000) == [(512, 32), (2048, 8), (8192, 2)]
    assert window_plan([64, 5000], 1, 1000) == [(64, 15), (999, 1)]  # cut to the text


def test_mixed_length_distillation_trains_at_each_length_in_turn(tiny_model, monkeypatch):
    """A list of window lengths: the student sees each in turn, as many tokens a step."""
    teacher = tiny_model("linear", seed=11, vocab_size=256, mini_batch_size=4)
    student = convert(teacher, "parallel")
    seen = []
    forward = type(student).forward
    monkeypatch.setattr(type(student), "forward", lambda self, ids: seen.append(tuple(ids.shape)) or forward(self, ids))
    train = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(1)).tolist()
    distill(teacher, student, train, steps=4, batch=2, ctx=[8, 32], device="cpu")
    assert seen == [(8, 8), (8, 8), (2, 32), (2, 32)] * 2  # each step: the teacher's forward, then the student's


def test_a_teacher_pool_runs_the_teacher_once_a_batch_and_the_steps_reuse_it(tiny_model):
    """distill(pool=P): the teacher runs P times a length, before the first step; its logits are kept
    (bfloat16) and the steps take them in turn; the student still learns."""
    from edgettt.distill import teacher_forward, teacher_pool, window_plan

    teacher = tiny_model("linear", seed=11, vocab_size=256, mini_batch_size=4)
    train = torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(2)).tolist()
    data = torch.tensor(train)
    plan = window_plan([8, 32], 2, data.numel())
    pools = teacher_pool(teacher_forward(teacher, "cpu"), data, plan, 3, torch.Generator().manual_seed(0), "cpu")
    assert [len(p) for p in pools] == [3, 3]
    for (length, windows), kept in zip(plan, pools):
        for ids, logits in kept:
            assert ids.shape == (windows, length) and logits.dtype == torch.bfloat16
            with torch.no_grad():
                assert (logits.float() - teacher(ids)).abs().max() < 0.02 * teacher(ids).abs().max()
    calls = []
    teacher.register_forward_hook(lambda *args: calls.append(1))
    student = convert(teacher, "parallel")
    losses = distill(teacher, student, train, steps=60, batch=2, ctx=[8, 32], lr=1e-3, device="cpu", pool=3)
    assert len(calls) == 3 * 2 and len(losses) == 60
    assert sum(losses[-6:]) < sum(losses[:6])


def test_the_teacher_forward_off_the_gpu_is_the_teachers_logits_without_gradients(tiny_model):
    from edgettt.distill import teacher_forward

    teacher = tiny_model("linear", seed=11, vocab_size=256, mini_batch_size=4)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    logits = teacher_forward(teacher, "cpu")(ids)
    assert not logits.requires_grad and torch.equal(logits, teacher(ids).detach())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["ttt-mlp-tiny", "ttt-linear-tiny"])
def test_the_teacher_forward_replays_one_cuda_graph_a_shape_with_the_eager_logits(name, capsys):
    """On a GPU the teacher's forward is recorded once a batch shape and replayed (TTT-MLP's mini-batch loop
    is launch-bound): each call's logits are the eager forward's for that call's windows, shapes mixed."""
    import edgettt
    from edgettt.distill import teacher_forward

    teacher = edgettt.load(name).cuda().eval()
    if teacher.form == "ttt" and name == "ttt-linear-tiny":
        teacher = edgettt.convert(teacher, "exact")  # as distillation runs it: the exact-form kernel
    forward, gen = teacher_forward(teacher, "cuda"), torch.Generator().manual_seed(0)
    for shape in [(4, 64), (2, 256), (4, 64), (2, 256)]:
        ids = torch.randint(0, 256, shape, generator=gen).cuda()
        with torch.no_grad():
            expected = teacher(ids)
        assert torch.allclose(forward(ids), expected, atol=1e-4, rtol=1e-4)
    assert "not captured" not in capsys.readouterr().err
