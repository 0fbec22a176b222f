"""benchmarks/state_options.py: its options round as they say (the measurements are committed in
benchmarks/results/state_options.md)."""

import sys
from pathlib import Path

LAB = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(LAB), str(LAB.parent / "tests")]  # the lab's library (`lab`); the core tests' helpers (conftest)

import conftest  # noqa: E402,F401  (first: it sets up torch and Triton for the tests)
import torch  # noqa: E402
from lab import state_options  # noqa: E402

from edgettt.formats.state_formats import requantize_int8_state, two_level_round  # noqa: E402


def walk(name: str, commits: int = 400, seed: int = 0):
    """Commit random updates through option `name`; the stored state's largest distance from the true
    sum, in steps, at the end."""
    gen = torch.Generator().manual_seed(seed)
    S0 = torch.zeros(2, 8, 16)
    step = torch.full((2, 8), 0.01)
    fn = state_options.option(name, S0, lambda p: step, {}, "k")
    true = stored = S0.clone()
    for n in range(commits):
        update = torch.randn(2, 8, 16, generator=gen) * 0.003
        true = true + update
        stored = fn(stored + update, n)
    return ((stored - true).abs().max() / 0.01).item()


def test_int8_is_the_int8_state_format():
    S0, S = torch.randn(2, 4, 6), torch.randn(2, 4, 6)
    step = torch.rand(2, 4) * 0.05 + 0.01
    fn = state_options.option("int8", S0, lambda p: step, {}, "k")
    assert torch.equal(fn(S, 0), requantize_int8_state(S, S0, step))


def test_error_feedback_keeps_the_state_within_a_step_where_rounding_walks_away():
    """Rounding at every commit adds up its errors (a random walk: 13.7 steps at worst after 400 commits,
    measured); feeding the residual back keeps the stored state within half a step, or, the residual in
    4 bits, within the walk of its sixteenths (1.9 steps)."""
    assert walk("int8") > 8
    assert walk("int8-ef-float") <= 0.5 + 1e-4
    assert walk("int8-ef-int4") < 3
    assert walk("int8-dynamic-ef-int4") < 3


def test_the_composed_two_level_option_is_the_int12_format():
    S0, S = torch.randn(2, 4, 16), torch.randn(2, 4, 16)
    fn = state_options.option("q8-2level", S0, lambda p: torch.ones(2, 4), {}, "k")
    assert torch.allclose(fn(S, 0), two_level_round(S, S0), atol=1e-6)


def test_a_hadamard_rotation_is_undone_and_feedback_keeps_the_walk_near_the_sum():
    H = state_options.hadamard(16, torch.float64)
    assert torch.allclose(H @ H.T, torch.eye(16, dtype=torch.float64))
    S0, S = torch.zeros(2, 4, 16), torch.randn(2, 4, 16)
    step = S.abs().amax(-1, keepdim=True) * 16 ** 0.5 / 127  # (the rotated row's max is at most sqrt(16) x)
    assert ((state_options.option("q8-had", S0, lambda p: torch.ones(2, 4), {}, "k")(S, 0) - S).abs() <= step).all()
    assert walk("q8-ef4") < walk("q8") / 2
