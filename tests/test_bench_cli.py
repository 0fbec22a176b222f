"""`edgettt bench`: its refusals without a GPU and its tables (the timing itself runs on the GPU machine)."""

import pytest
import torch
from click.testing import CliRunner

from edgettt import bench
from edgettt.cli import cli


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_bench_without_cuda_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "--json", str(tmp_path / "b.json")])
    assert result.exit_code == 1
    assert "needs a CUDA GPU" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("args,message", [(["--seq-lens", "8k"], "comma-separated integers"),
                                          (["--gemv", "4096by4096"], "NxK shapes")])
def test_bench_rejects_malformed_lists(args, message):
    result = CliRunner().invoke(cli, ["bench", *args])
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


def test_rotation_covers_several_l2s():
    assert bench.copies_for(8 << 20) * (8 << 20) >= bench.L2_ROTATION_BYTES
    assert bench.copies_for(10 << 30) == 2
