"""The three linear-attention computations (naive / chunk / recurrent) agree, from any start."""

import pytest
import torch

from conftest import FP32_EXACT, rel_err
import edgettt.linear_attention as la


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
