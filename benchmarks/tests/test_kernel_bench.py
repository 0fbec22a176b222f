"""benchmarks/kernel_bench.py: its refusals without a GPU and its tables (the timing itself runs on the GPU machine)."""

import sys
from pathlib import Path

LAB = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(LAB), str(LAB.parent / "tests")]  # the lab's library (`lab`); the core tests' helpers (conftest)

from conftest import rel_err  # noqa: E402  (first: it sets up torch and Triton for the tests)

import pytest  # noqa: E402
import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from lab import kernel_bench as bench  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_bench_without_cuda_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(bench.main, ["--json", str(tmp_path / "b.json")])
    assert result.exit_code == 1
    assert "needs a CUDA GPU" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("args,message", [(["--seq-lens", "8k"], "comma-separated positive integers"),
                                          (["--gemv", "4096by4096"], "NxK shapes"),
                                          (["--gemv", "4096x4096x2"], "NxK shapes"),
                                          (["--train", "256x4x512"], "BxHxTxd shapes")])
def test_bench_rejects_malformed_lists(args, message):
    result = CliRunner().invoke(bench.main, [*args])
    assert result.exit_code == 2 and message in result.output


def test_ratios_and_tables():
    rows = [bench.row("prefill", "ours", 0.5, 2_000_000_000, 4e12, 1000, T=8),
            bench.row("prefill", "theirs", 2.0, 2_000_000_000, 4e12, 1000, T=8)]
    bench.add_ratios(rows, ["theirs"])
    assert rows[0]["x theirs"] == pytest.approx(4.0) and rows[1]["x theirs"] == pytest.approx(1.0)
    assert rows[0]["fraction_of_copy"] == pytest.approx(1.0)  # 2 GB in 0.5 ms = 4 TB/s
    assert rows[0]["tokens_per_s"] == pytest.approx(2e6)
    text = bench.table({"rows": rows})
    assert "### prefill" in text and "| 8 | ours | 0.5 |" in text and "4.00x" in text
    rows[0]["graph_ms"], rows[1]["graph_ms"] = 0.25, 1.5  # the GPU's time alone, where measured
    bench.add_ratios(rows, ["theirs"], key="graph_ms", prefix="graph x ")
    assert rows[0]["graph x theirs"] == pytest.approx(6.0)
    text = bench.table({"rows": rows})
    assert "| graph ms |" in text and "| 8 | ours | 0.5 | 0.25 |" in text and "6.00x" in text


def test_rotation_covers_several_l2s():
    assert bench.copies_for(8 << 20) * (8 << 20) >= bench.L2_ROTATION_BYTES
    assert bench.copies_for(10 << 30) == 2


def test_training_rows_compute_the_same_gradients():
    """The three forward + backward runs the train rows time agree (the scan's gamma and beta are its
    own layer's, so their gradients go there: compared are q, k, v, lr, S0 and eta)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    runs = bench.train_runs(2, 2, 32, 16, b=16, device=device)
    grads = {name: fn() for name, fn in runs.items()}
    kernel, scan, exact = grads.values()
    for i in (0, 1, 2, 3, 4, 7):
        assert rel_err(kernel[i], exact[i]) < 1e-4 and rel_err(kernel[i], scan[i]) < 1e-4, i


def test_lact_rows_compute_the_same_operator():
    """The LaCT rows that compute the same thing agree: the W1-only parallel form through the kernels
    (the interpreter on a CPU), in torch, and the exact chunk-recurrent form in torch (a small layer
    of the benchmark's kind: momentum, one rate a token)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    runs = bench.lact_runs(2, 40, torch.float32, device=device, hidden_size=64, num_attn_heads=4, num_lact_heads=2,
                           lact_chunk_size=16, window_size=16)
    with torch.no_grad():
        kernel = runs["parallel kernels (W1-only)"]()
        assert rel_err(kernel, runs["parallel torch (fp32)"]()) < 1e-5
        assert rel_err(kernel, runs["exact torch, W1-only (fp32)"]()) < 1e-5
        assert rel_err(kernel, runs["parallel kernels (W1-only), dense W0/W2"]()) < 1e-5
        out, _ = runs["parallel kernels, attention alone (features given)"]()
        assert out.shape == kernel.shape and torch.isfinite(out).all()


def test_the_public_layer_row_gets_the_operator_inputs_in_its_layout(tmp_path):
    """The row of the public code's layer (`--lact-code`) feeds it the same q, k, v, rates, gates and
    weights in its [B * heads, T, d] layout: a stand-in file whose `block_causal_lact_swiglu` is the
    tests' transcription of the public code, told to update W1 alone, computes the W1-only row's output."""
    tests = LAB.parent / "tests"
    code = tmp_path / "ttt_operation.py"
    code.write_text(f"import sys\nsys.path.insert(0, {str(tests)!r})\nfrom lact_reference import block_causal\n\n\n"
                    "def block_causal_lact_swiglu(w0, w1, w2, q, k, v, lr0, lr1, lr2, chunk_size, use_muon, momentum):\n"
                    "    return block_causal(w0, w1, w2, q, k, v, lr0, lr1, lr2, chunk_size, use_muon, momentum, False,\n"
                    "                        update_w0_w2=False, weight_norm=False)\n")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, T = 2, 40
    runs = bench.lact_runs(B, T, torch.float32, lact_code=code, device=device, hidden_size=64, num_attn_heads=4,
                           num_lact_heads=2, lact_chunk_size=16, window_size=16)
    with torch.no_grad():
        public = runs["public LaCT torch layer (full update, compiled)"]()
        ours = runs["exact torch, W1-only (fp32)"]()
    assert rel_err(public.reshape(ours.shape), ours) < 1e-5


def test_the_fastest_row_is_the_least_time_of_its_family():
    rows = [{"group": "g", "name": "base, a", "ms": 3.0, "graph_ms": 1.0}, {"group": "g", "name": "base, b", "ms": 2.0},
            {"group": "g", "name": "other", "ms": 0.5, "graph_ms": 0.1}]
    bench.add_fastest(rows, "base", "base at its best")
    best = rows[-1]
    assert (best["name"], best["ms"], best["graph_ms"], best["of"]) == ("base at its best", 2.0, 1.0, ["base, a", "base, b"])
