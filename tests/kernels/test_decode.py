"""The decode-step kernel against its plain-torch reference (CPU: Triton interpreter; GPU: marked)."""

import pytest
import torch

from conftest import rel_err
from edgettt.kernels.decode import decode_step, decode_step_ref

# on a CPU the kernels run in the Triton interpreter; with a GPU they run compiled (not on CPU tensors)
DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
# named tolerances (relative RMS error)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def inputs(B, H, DK, DV, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    return r(B, H, DK), r(B, H, DK), r(B, H, DV), r(B, H, DK, DV), r(B, H, DK, DV)


def dtypes(device):
    return [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 17, 16), (1, 2, 49, 48), (3, 1, 65, 200)])
@pytest.mark.parametrize("inner", [0, 2, 3])  # 3 = the last of a mini-batch of 4: commit
def test_decode_step_matches_reference(device, shape, inner):
    commit = inner == 3
    for dtype in dtypes(device):
        qa, ka, vh, S, A = inputs(*shape, dtype, device)
        eta = torch.tensor([1.0, 0.4, 0.3, 0.0625], device=device)
        S_ref, A_ref = S.float().clone(), A.float().clone()
        z_ref = decode_step_ref(qa.float(), ka.float(), vh.float(), S_ref, A_ref, eta, inner)
        z = torch.full(z_ref.shape, float("nan"), dtype=dtype, device=device)  # poisoned output
        decode_step(qa, ka, vh, S, A, eta, inner, out=z)
        assert not torch.isnan(z).any()
        assert rel_err(z.float(), z_ref) < TOL[dtype], dtype
        assert rel_err(S.float(), S_ref) < TOL[dtype], dtype
        if commit:
            assert A.abs().max() == 0
        else:
            assert rel_err(A.float(), A_ref) < TOL[dtype], dtype


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_step_writes_every_state_element_on_gpu():
    qa, ka, vh, S, A = inputs(64, 16, 65, 64, torch.float32, "cuda")
    S_ref, A_ref = S.clone(), A.clone()
    eta = torch.tensor([1.0, 0.5, 0.1], device="cuda")
    decode_step_ref(qa, ka, vh, S_ref, A_ref, eta, 2)
    z = torch.full((64, 16, 64), float("nan"), device="cuda")
    decode_step(qa, ka, vh, S, A, eta, 2, out=z)
    assert not torch.isnan(z).any()
    assert torch.allclose(S, S_ref, atol=1e-4) and torch.equal(A, A_ref)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["linear", "mlp"])
def test_model_decode_with_the_kernel_equals_prefill_on_gpu(tiny_model, family):
    from edgettt import convert

    model = convert(tiny_model(family, seed=2, mini_batch_size=8, share_qk=True), "parallel").cuda()
    ids = torch.randint(0, model.config.vocab_size, (3, 29), device="cuda")
    with torch.no_grad():
        full = model(ids)
        logits, state = model.prefill(ids[:, :5])
        outs = [logits]
        for t in range(5, 29):
            step, state = model.step(ids[:, t], state)
            outs.append(step[:, None])
    assert rel_err(torch.cat(outs, 1), full) < 1e-5
