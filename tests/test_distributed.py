"""`convert --distill` and `calibrate` over several processes (torchrun, gloo on the CPU): two processes train as
one does at the same global batch, FSDP2 as data parallel, a job whose rank was killed resumes to the uninterrupted
run's weights (on the same number of processes exactly, on another within float tolerance), the checkpoints' files
run no code, and bad input is one line before any work."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import cli_ok

HERE = Path(__file__).parent
SETTINGS = "steps=12,batch=4,ctx=32,lr=3e-3"


def torchrun(*args, processes: int = 2, script=None, env=None) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node N -m edgettt ARGS` (or SCRIPT ARGS), two CPU processes on gloo."""
    target = [str(script)] if script else ["-m", "edgettt"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               *target, "--no-progress", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})


def distill_args(root: Path, out: str, *extra: str):
    return ["convert", root / "M", root / out, "--form", "parallel", "--distill", ",".join((SETTINGS, *extra)),
            "--data", root / "train.txt", "--no-report"]


def losses(path: Path) -> list[float]:
    return json.loads((path / "convert_report.json").read_text())["distill"]["losses"]


def max_difference(a: Path, b: Path) -> float:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    return max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa)


def succeeded(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A small TTT-Linear, a text, the one-process distillation (A) and the two-process one (B)."""
    root = tmp_path_factory.mktemp("distributed")
    gen = torch.Generator().manual_seed(0)
    words = "def class return import the of a print value list for while".split()
    (root / "train.txt").write_text(" ".join(words[i] for i in torch.randint(0, len(words), (6000,), generator=gen)))
    cli_ok("create", root / "M", "--set", "hidden_size=32", "--set", "intermediate_size=64", "--set",
           "num_hidden_layers=2", "--set", "mini_batch_size=8")
    cli_ok(*distill_args(root, "A"))
    succeeded(torchrun(*distill_args(root, "B")))
    return root


def test_two_processes_train_as_one_process_does_at_the_same_global_batch(root):
    """Each rank takes half of every step's windows and its own teacher logits; the averaged gradients are the
    whole batch's: the same loss curve and weights within float tolerance (sums in another order)."""
    one, two = losses(root / "A"), losses(root / "B")
    assert len(one) == len(two) == 12
    assert max(abs(x - y) / abs(x) for x, y in zip(one, two)) < 1e-5
    assert max_difference(root / "A", root / "B") < 1e-5
    report = json.loads((root / "B" / "convert_report.json").read_text())["distill"]
    assert report["processes"] == 2 and report["shard"] is False
    assert not (root / "B.distill").exists()


def test_fsdp2_trains_the_model_data_parallel_trains(root):
    """shard=1: the model sharded by FSDP2, each block recomputed in the backward pass (activation checkpointing);
    the same weights as data parallel within float tolerance, written whole by rank 0."""
    succeeded(torchrun(*distill_args(root, "C", "shard=1")))
    assert max(abs(x - y) / abs(x) for x, y in zip(losses(root / "B"), losses(root / "C"))) < 1e-5
    assert max_difference(root / "B", root / "C") < 1e-5


def test_a_killed_rank_ends_the_job_and_the_resumed_run_equals_the_uninterrupted_one(root):
    """Rank 1 dies right after the checkpoint of step 4: the job ends (no hang), rank 0 in one line; resume=1 on
    two processes continues to exactly the uninterrupted run's weights and losses, and on one process (the
    checkpoint resharded) to them within float tolerance."""
    killed = torchrun(*distill_args(root, "D", "save_every=4"), script=HERE / "distributed_job.py",
                      env={"KILL": "1:4"})
    assert killed.returncode != 0 and not (root / "D").exists()
    assert [p.name for p in (root / "D.distill").iterdir()] == ["step-000004"]
    lines = [line for line in killed.stderr.splitlines() if line.startswith("Error: rank 0 of 2: lost contact")]
    assert len(lines) <= 1  # (torchrun may stop rank 0 before it notices)
    shutil.copytree(root / "D.distill", root / "E.distill")

    succeeded(torchrun(*distill_args(root, "D", "save_every=4", "resume=1")))
    assert losses(root / "D") == losses(root / "B")
    assert max_difference(root / "B", root / "D") == 0
    assert not (root / "D.distill").exists()  # (the model written: the checkpoints removed)

    cli_ok(*distill_args(root, "E", "save_every=4", "resume=1"))
    assert max_difference(root / "B", root / "E") < 1e-5


def test_calibration_over_two_processes_equals_one_process(root):
    """Each rank its share of the windows; the Hessians and the state's maxima added up: the same file."""
    cli_ok("calibrate", root / "A", root / "one.st", "--data", root / "train.txt", "--ctx", "64",
           "--samples", "4")
    done = succeeded(torchrun("calibrate", root / "A", root / "two.st", "--data", root / "train.txt", "--ctx", "64",
                              "--samples", "4"))
    assert done.stdout.count("wrote") == 1  # (rank 0 speaks for the job)
    one, two = load_file(root / "one.st"), load_file(root / "two.st")
    assert one.keys() == two.keys()
    for key in one:
        assert ((one[key].double() - two[key].double()).norm() / one[key].double().norm().clamp_min(1e-30)) < 1e-5


def test_a_world_that_does_not_divide_the_batch_is_refused_by_every_rank_before_any_work(root):
    done = torchrun("convert", root / "M", root / "F", "--form", "parallel", "--distill", "steps=2,batch=3,ctx=32",
                    "--data", root / "train.txt", "--no-report")
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert done.returncode != 0 and len(errors) == 2
    assert all("distill batch: 3 does not divide among 2 processes" in line for line in errors)
    assert not (root / "F").exists()


class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_checkpoint_index_that_would_run_code_is_refused(root, tmp_path):
    """DCP's `.metadata` is a pickle: it is read with an unpickler that builds DCP's metadata classes only."""
    from edgettt.errors import EdgetttError
    from edgettt.resume import SafeReader

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(EdgetttError, match="not a checkpoint's index"):
        SafeReader(tmp_path).read_metadata()
    assert not (Path.cwd() / "pwned").exists()


def resume_cases(root: Path) -> dict:
    other = root / "other.distill" / "step-000004"
    other.mkdir(parents=True, exist_ok=True)
    (other / "checkpoint.json").write_text(json.dumps({"format": 1, "identity": {"teacher": "0" * 16}}))
    old = root / "old.distill" / "step-000004"
    old.mkdir(parents=True, exist_ok=True)
    (old / "checkpoint.json").write_text(json.dumps({"format": 99}))
    (root / "stale.distill").mkdir(exist_ok=True)
    return {
        "resume without checkpoints": (distill_args(root, "none", "resume=1"), {}, "no checkpoint to resume from"),
        "resume another distillation": (distill_args(root, "other", "resume=1"), {},
                                        "a checkpoint of another distillation (ctx, settings, student, teacher, text"),
        "resume another format": (distill_args(root, "old", "resume=1"), {}, "checkpoint format 99"),
        "stale checkpoints": (distill_args(root, "stale"), {}, "checkpoints of an earlier distillation"),
        "nccl without GPUs": (distill_args(root, "G"), {"EDGETTT_BACKEND": "nccl"}, "NCCL runs only between GPUs"),
        "unknown backend": (distill_args(root, "G"), {"EDGETTT_BACKEND": "mpi"}, "use gloo or nccl"),
        "world without torchrun": (distill_args(root, "G"), {"WORLD_SIZE": "2"}, "start the job with torchrun"),
        "another command": (["quantize", root / "A", root / "G"], {"WORLD_SIZE": "2"},
                            "torchrun runs convert and calibrate"),
        "resume=2": (distill_args(root, "G", "resume=2"), {}, "'2' is not 0 or 1"),
    }


@pytest.mark.parametrize("case", ["resume without checkpoints", "resume another distillation", "resume another format",
                                  "stale checkpoints", "nccl without GPUs", "unknown backend", "world without torchrun",
                                  "another command", "resume=2"])
def test_bad_input_is_one_line_and_nothing_is_written(root, case, monkeypatch):
    from click.testing import CliRunner

    from edgettt.cli import cli

    if case == "nccl without GPUs" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    args, env, message = resume_cases(root)[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    before = sorted(p.name for p in root.iterdir())
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code in (1, 2) and message in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert sorted(p.name for p in root.iterdir()) == before


def test_fsdp2_is_chosen_where_data_parallel_would_not_fit_the_gpu(monkeypatch, tiny_model):
    """shard left out: the teacher, the student and its gradients and AdamW moments against half the GPU."""
    from types import SimpleNamespace

    from edgettt.conversion import convert
    from edgettt.distributed import fits

    teacher = tiny_model()
    student = convert(teacher, "parallel")
    needed = sum(p.numel() * 4 for p in teacher.parameters()) + sum(p.numel() for p in student.parameters()) * 16
    for memory, expected in ((2 * needed, True), (2 * needed - 1, False)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=memory))
        assert fits(teacher, student, "cuda") is expected
    assert fits(teacher, student, "cpu")


def test_one_process_can_shard_for_fsdp2s_checkpointing_and_trains_as_data_parallel(tiny_model):
    """shard=1 without torchrun: a process group of one, FSDP2 and activation checkpointing; the same weights."""
    from edgettt import distributed
    from edgettt.conversion import convert
    from edgettt.distill import distill

    teacher = tiny_model(vocab_size=256, mini_batch_size=4)
    tokens = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(2)).tolist()
    plain, sharded = convert(teacher, "parallel"), convert(teacher, "parallel")
    try:
        a = distill(teacher, plain, tokens, steps=3, batch=2, ctx=16, device="cpu")
        b = distill(teacher, sharded, tokens, steps=3, batch=2, ctx=16, device="cpu", shard=True)
    finally:
        distributed.stop()
    assert max(abs(x - y) / abs(x) for x, y in zip(a, b)) < 1e-5
    for (name, p), q in zip(plain.state_dict().items(), sharded.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-6), name


def test_force_replaces_an_earlier_runs_checkpoints(root):
    """--force starts over where OUT.distill/ holds another run's checkpoints (one of the same step among them):
    the new run's replace them, and go once OUT is written."""
    stale = root / "H.distill" / "step-000004"
    stale.mkdir(parents=True)
    (stale / "checkpoint.json").write_text("{}")
    cli_ok(*distill_args(root, "H", "save_every=4"), "--force")
    assert (root / "H" / "model.safetensors").exists() and not (root / "H.distill").exists()
    assert max_difference(root / "A", root / "H") < 1e-6
