"""The int8 state's chain of prefill commits (`ops.linear_attention.commits`) against its plain-torch reference
(CPU: Triton interpreter; GPU: compiled)."""

import pytest
import torch

from conftest import rel_err
from edgettt.ops.linear_attention.commits import two_level_commits, two_level_commits_ref
from edgettt.formats.state_formats import two_level_codes

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]


def inputs(B, H, N, DK, DV, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    S0 = torch.randn(H, DK, DV, generator=g)
    S = S0 + 0.1 * torch.randn(B, H, DK, DV, generator=g)
    U = torch.randn(B, H, N, DK, DV, generator=g)
    U[:, :, :, 1] = 0  # a row that does not move: its step stays at the floor, its values at S0 + (S - S0)
    return S.to(device), S0.to(device), U.to(device), torch.tensor(0.05, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 5, 17, 16), (1, 2, 4, 65, 64), (1, 1, 3, 9, 200)])
@pytest.mark.parametrize("decayed", [False, True])  # a decayed form: S <- round2(S0 + gamma (S - S0) + eta U_n)
def test_two_level_commits_match_the_reference(device, shape, decayed):
    S, S0, U, eta = inputs(*shape, device)
    decay = torch.linspace(0.5, 1.0, shape[1], device=device) if decayed else None
    ref = two_level_commits_ref(S, S0, U, eta, decay)
    got = two_level_commits(S, S0, U, eta, decay)
    if decayed:  # the decay matters, and the reference is the model's own loop (`la.committed_states`)
        from edgettt.ops.linear_attention import reference as la
        from edgettt.formats.state_formats import TwoLevelRounding

        assert rel_err(ref, two_level_commits_ref(S, S0, U, eta)) > 1e-2
        with torch.no_grad():
            model_loop = la.committed_states(S.cpu(), U.cpu(), eta.cpu(), TwoLevelRounding(S0.cpu()),
                                             torch.arange(U.shape[2]), la.Decay(decay.cpu(), S0.cpu()))
        assert rel_err(model_loop, ref.cpu()) < 1e-5
    assert got.shape == ref.shape and not torch.isnan(got).any()
    # the same float32 operations in the same order: equal to an ulp or two (a GPU fuses a product and a sum
    # into one rounding: 17% of the values differ in their last bits on the H200) but for a rare rounding
    # flip (a division an ulp off), which moves a value by one fine step
    assert ((got - ref).abs() > 1e-5).float().mean() < 1e-3 and rel_err(got, ref) < 1e-5
    coarse, fine, step = two_level_codes(got, S0[None, :, None])  # every state on the format's grid
    assert torch.allclose(S0[None, :, None] + (coarse + fine / 15) * step, got, atol=1e-6, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_two_level_commits_keep_a_float16_state_in_its_type(device):
    S, S0, U, eta = inputs(1, 2, 3, 17, 16, device, seed=1)
    got = two_level_commits(S.half(), S0, U.half(), eta)
    ref = two_level_commits_ref(S.half().float(), S0, U.half().float(), eta)
    assert got.dtype == torch.float16 and rel_err(got.float(), ref) < 2e-3
