"""`edgettt bench`'s worker processes: fresh (one a measurement, the CPU's default) or kept (one a path
for the run, CUDA's default: a model loads and its steps compile once). Checked on the CPU through the
torch engine with a shipped model: the order records which process timed each measurement."""

import json

import pytest
import torch
from click.testing import CliRunner

from edgettt.benchmark import run, write
from edgettt.benchmark import tests as bench_tests
from edgettt.cli import cli
from edgettt.errors import EdgetttError
from edgettt.outputs import plan_outputs

MODELS = ["ttt-linear-tiny", "ttt-linear-tiny-parallel"]


def bench(tmp_path, *options):
    out = tmp_path / f"bench{len(list(tmp_path.iterdir()))}.json"
    result = CliRunner().invoke(cli, ["bench", *MODELS, "--pp", "8", "--tg", "3", "--depth", "0,5", "-r", "2",
                                      "--threads", "1", "--json", str(out), *options])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_kept_workers_time_every_measurement_of_a_path_in_one_process():
    """Kept workers (CUDA's way; on the CPU through the API, as the lab's studies ask for them)."""
    data = run(MODELS, bench_tests([8], [3], [0, 5]), 2, threads=1, keep_workers=True)
    pids = {}
    for _, path, _, pid in data["order"]:
        pids.setdefault(path, set()).add(pid)
    assert len(data["order"]) == 2 * 2 * 3 and [o[1] for o in data["order"][:2]] == MODELS  # in turns
    assert all(len(p) == 1 for p in pids.values()) and len(set.union(*pids.values())) == 2
    assert data["meta"]["workers"] == "one a path, kept"
    assert all(r["tokens_per_s"] > 0 and r["min"] <= r["tokens_per_s"] <= r["max"] for r in data["rows"])


def test_fresh_workers_are_the_cpu_default_one_process_a_measurement(tmp_path):
    data = bench(tmp_path, "--depth", "0", "-r", "1")  # (fewer measurements: each starts a process)
    assert len({o[3] for o in data["order"]}) == len(data["order"]) == 4
    assert data["meta"]["workers"] == "one a measurement"


def test_a_kept_worker_that_fails_ends_the_run_in_one_line(tmp_path):
    """A path whose worker cannot load it (its weights file cut short) ends a run with kept workers in
    one line naming it, with no traceback, the other path's worker stopped."""
    bad = tmp_path / "bad"
    result = CliRunner().invoke(cli, ["convert", "ttt-linear-tiny", str(bad), "--form", "parallel", "--no-report"])
    assert result.exit_code == 0, result.output
    weights = next(f for f in bad.iterdir() if f.suffix == ".safetensors")
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(EdgetttError) as failed:
        run([MODELS[0], str(bad)], bench_tests([8], [2], [0]), 1, keep_workers=True)
    assert str(bad) in str(failed.value) and len(str(failed.value).splitlines()) == 1


def test_a_run_cut_short_keeps_the_repetitions_it_finished(tmp_path, monkeypatch):
    """The JSON and the table are rewritten after every repetition: a run whose worker fails in its second
    repetition ends in one line and leaves the first's results (the same files a whole run replaces)."""
    from edgettt.benchmark import parent

    timed = parent.Workers.time
    calls = []

    def failing_in_the_second_repetition(self, path, test):
        calls.append(path)
        if len(calls) > 2 * 2:  # 2 paths x 2 tests a repetition
            raise EdgetttError(f"{path}: the worker stopped (simulated)")
        return timed(self, path, test)

    monkeypatch.setattr(parent.Workers, "time", failing_in_the_second_repetition)
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    json_out, md_out = plan_outputs((out, "json", False, "--json"), (md, "markdown", False, "--markdown"))
    with pytest.raises(EdgetttError, match="simulated"):
        run(MODELS, bench_tests([8], [2], [0]), 3, threads=1, keep_workers=True,
            partial=lambda so_far: write(so_far, json_out, md_out))
    data = json.loads(out.read_text())
    assert data["meta"]["repetitions"] == 1 and data["meta"]["repetitions_asked"] == 3
    assert len(data["order"]) == 4 and len(data["rows"]) == 4 and "ttt-linear-tiny" in md.read_text()
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []  # no staging left behind


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kept_workers_on_cuda_time_compiled_steps_and_reset_the_peak_per_test(tmp_path):
    """`bench --device cuda` (kept workers, the default there): every measurement of a path in
    one process; the transformer's peak at depth 4096 (its KV cache, 151 MB more) stays above its peak at
    depth 0, timed after it in the second repetition: the peak is each test's own, not the worker's
    high-water mark."""
    out = tmp_path / "s.json"
    result = CliRunner().invoke(cli, ["bench", "llama:125m", "ttt-linear-tiny-parallel", "--device", "cuda",
                                      "--pp", "64", "--tg", "8", "--depth", "0,4096", "-r", "2",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert len({(o[1], o[3]) for o in data["order"]}) == 2 and data["meta"]["workers"] == "one a path, kept"
    peak = {(r["path"], r["test"]): r["peak_rss_mb"] for r in data["rows"]}
    assert peak[("llama:125m", "tg8@d4096")] > peak[("llama:125m", "tg8@d0")] + 50  # 4096 x 12 layers x (k, v) x 768 x 2 B
    assert peak[("llama:125m", "pp64")] < peak[("llama:125m", "tg8@d4096")]
    h100_class = data["meta"]["dense_bf16_TFLOPs"] is not None
    for r in data["rows"]:  # decode rows: the bytes a step moves, against the copy bandwidth; prefill: FLOPs
        assert ("fraction_of_copy" in r) == r["test"].startswith("tg") and 0 < r.get("fraction_of_copy", 1) <= 1
        assert ("fraction_of_dense_bf16" in r) == (h100_class and r["test"].startswith("pp"))
        assert 0 < r.get("fraction_of_dense_bf16", 1) <= 1
    cache = 4104 * 12 * 2 * 768 * 2  # depth + decoded tokens, 12 layers, k and v, bf16
    by_test = {(r["path"], r["test"]): r.get("step_bytes") for r in data["rows"]}
    assert by_test[("llama:125m", "tg8@d4096")] - by_test[("llama:125m", "tg8@d0")] == cache - 9 * 12 * 2 * 768 * 2
    assert "% copy" in result.output and data["meta"]["copy_bandwidth_GBps"] > 1000


def test_a_cpu_worker_timing_an_export_runs_without_torch():
    """The worker and the export's engine import numpy and onnxruntime only: the peak memory a row reports
    is the export's, not torch's."""
    import subprocess
    import sys

    code = ("import sys; import edgettt.benchmark.worker, edgettt.benchmark.onnx_engine, edgettt.benchmark.plan; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
