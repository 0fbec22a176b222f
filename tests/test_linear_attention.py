"""The three linear-attention computations (naive / chunk / recurrent) agree, from any start."""

import pytest
import torch

from conftest import FP32_EXACT, rel_err
from edgettt.ops.linear_attention import reference as la


def random_inputs(T, start, b=4, B=2, H=3, Dk=5, Dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    A = r(B, H, Dk, Dv) * (start % b != 0)  # an unfinished mini-batch only mid-way
    eta = torch.rand(b, generator=g) + 0.1
    return r(B, H, T, Dk), r(B, H, T, Dk), r(B, H, T, Dv), r(B, H, Dk, Dv), A, eta


@pytest.mark.parametrize("T", [1, 3, 4, 9, 17])
@pytest.mark.parametrize("start", [0, 1, 3, 4, 6])
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_agrees_with_naive(T, start, fn):
    args = random_inputs(T, start)
    expected = la.naive(*args, start)
    actual = la.FORMS[fn](*args, start)
    for a, e, name in zip(actual, expected, ("output", "S", "A")):
        assert rel_err(a, e) < FP32_EXACT or (name == "A" and e.abs().max() == 0 and a.abs().max() == 0), name


def test_mask_is_chunk_structured():
    """Token i of a mini-batch weighs its own mini-batch by eta[i], earlier ones by eta[b]."""
    T = 10
    eta = torch.tensor([1.0, 0.5, 0.25, 0.125])
    ones = torch.ones(1, 1, T, 1)  # every score q.k is 1 and the value of token j is one-hot at j
    zero = torch.zeros(1, 1, 1, T)
    zbar, _, _ = la.naive(ones, ones, torch.eye(T)[None, None], zero, zero, eta, 0)
    mask = zbar[0, 0]
    assert mask[5, 4] == eta[1] and mask[5, 5] == eta[1]  # same mini-batch, i = 2
    assert mask[5, 3] == eta[-1] and mask[9, 0] == eta[-1]  # earlier mini-batch
    assert mask[4, 5] == 0  # causal


@pytest.mark.parametrize("start", [0, 2, 3, 7])
def test_recurrent_takes_the_position_as_a_tensor(start):
    """The exported decode graph passes the position as a tensor: the commit becomes a `where`."""
    qa, ka, vh, S, A, eta = random_inputs(5, start)
    requant = lambda s, pos: torch.round(s * (8 + pos)) / (8 + pos)  # noqa: E731 (steps depend on the position)
    for rq in (None, requant):
        as_int = la.recurrent(qa, ka, vh, S, A, eta, start, rq)
        as_tensor = la.recurrent(qa, ka, vh, S, A, eta, torch.tensor(start), rq)
        for x, y in zip(as_int, as_tensor):
            assert torch.equal(x, y)


def random_decay(H=3, Dk=5, Dv=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return la.Decay(torch.tensor([0.9, 0.5, 1.0])[:H], torch.randn(H, Dk, Dv, generator=g))


@pytest.mark.parametrize("T", [1, 4, 9, 17])
@pytest.mark.parametrize("start", [0, 3, 4, 6])
def test_decayed_chunk_agrees_with_the_decayed_recurrence(T, start):
    """The prefill's closed form (lag weights gamma^(n-m), the start state's carry gamma^(n+1)) equals
    decaying S towards S0 at each commit token by token, with and without a rounding at each commit,
    with the position as an int or a tensor."""
    qa, ka, vh, S, A, eta = random_inputs(T, start)
    decay = random_decay()
    requant = lambda s, pos: torch.round(s * (8 + pos)) / (8 + pos)  # noqa: E731
    for rq in (None, requant):
        chunked = la.chunk(qa, ka, vh, S, A, eta, start, rq, decay)
        for position in (start, torch.tensor(start)):
            for x, y, name in zip(chunked, la.recurrent(qa, ka, vh, S, A, eta, position, rq, decay), ("out", "S", "A")):
                assert rel_err(x, y) < FP32_EXACT or (name == "A" and x.abs().max() == y.abs().max() == 0), name


def test_a_decay_of_one_is_no_decay_and_a_smaller_one_pulls_the_state_to_s0():
    qa, ka, vh, S, A, eta = random_inputs(17, 0)
    decay = random_decay()
    ones = la.Decay(torch.ones(3), decay.S0)
    for x, y in zip(la.chunk(qa, ka, vh, S, A, eta, 0, decay=ones), la.chunk(qa, ka, vh, S, A, eta, 0)):
        assert rel_err(x, y) < FP32_EXACT
    # two whole mini-batches from S: S0 + gamma^2 (S - S0) + eta_b (gamma U_0 + U_1), per head
    qa, ka, vh, S, A, eta = random_inputs(8, 0)
    _, S_after, _ = la.chunk(qa, ka, vh, S, A, eta, 0, decay=decay)
    U = [ka[:, :, i:i + 4].transpose(-1, -2) @ vh[:, :, i:i + 4] for i in (0, 4)]
    g = decay.gamma[:, None, None]
    expected = decay.S0 + g ** 2 * (S - decay.S0) + eta[-1] * (g * U[0] + U[1])
    assert rel_err(S_after, expected) < FP32_EXACT


def test_the_open_mini_batch_token_decays_at_its_commit_as_the_recurrence_does():
    """`open_token` (A kept as the mini-batch's keys and values) commits with the decay as `recurrent` does."""
    b = 4
    qa, ka, vh, S, A, eta = random_inputs(b, 0, b=b)
    decay = random_decay()
    K, V = torch.zeros(2, 3, b, 5), torch.zeros(2, 3, b, 6)
    S_rec, A_rec, S_open = S, A, S
    for i in range(b):
        z_rec, S_rec, A_rec = la.recurrent(qa[:, :, i:i + 1], ka[:, :, i:i + 1], vh[:, :, i:i + 1], S_rec, A_rec,
                                           eta, i, decay=decay)
        K[:, :, i], V[:, :, i] = ka[:, :, i], vh[:, :, i]
        filled = (torch.arange(b) <= i).float()
        z_open, S_open = la.open_token(qa[:, :, i:i + 1], K, V, filled, S_open, eta, i, decay=decay)
        assert rel_err(z_open, z_rec) < FP32_EXACT
    assert rel_err(S_open, S_rec) < FP32_EXACT and not torch.allclose(S_open, la.recurrent(qa, ka, vh, S, A, eta, 0)[1])


def test_a_decayed_state_stops_growing_with_the_text_where_the_plain_sum_keeps_growing():
    """The same increment every mini-batch: the plain state moves linearly with the text, the decayed one
    settles at eta_b U / (1 - gamma) from S0 (what `convert --decay`'s help says)."""
    B, H, Dk, Dv, b = 1, 2, 3, 4, 4
    ka, vh = torch.ones(B, H, 64 * b, Dk), torch.ones(B, H, 64 * b, Dv)
    S0, eta = torch.zeros(H, Dk, Dv), torch.full((b,), 0.5)
    decay = la.Decay(torch.tensor([0.5, 0.9]), S0)
    moved = {}
    for T in (16 * b, 64 * b):
        args = (ka[:, :, :T], ka[:, :, :T], vh[:, :, :T], S0.expand(B, H, Dk, Dv), torch.zeros(B, H, Dk, Dv), eta, 0)
        moved[T] = la.chunk(*args)[1].abs().amax(), la.chunk(*args, decay=decay)[1].abs().amax((0, 2, 3))
    assert moved[64 * b][0] == pytest.approx(4 * moved[16 * b][0])  # linear in the text
    bound = 0.5 * b / (1 - decay.gamma)  # eta_b * |U| / (1 - gamma), |U| = b a mini-batch of ones
    assert (moved[64 * b][1] <= bound + 1e-4).all()
    assert torch.allclose(moved[64 * b][1], bound * (1 - decay.gamma ** 64), rtol=1e-5)  # a geometric series
