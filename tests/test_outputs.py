"""Outputs that lose nothing (edgettt/outputs.py): staging, atomic replacement, leftovers of killed runs."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from edgettt import outputs
from edgettt.errors import EdgetttError
from edgettt.outputs import Output, plan_outputs, recognise


def model_dir(path: Path, marker: str = "old") -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "ttt", "marker": marker}))
    (path / "model.safetensors").write_bytes(b"weights " + marker.encode())
    return path


def write_model(out: Output, marker: str) -> None:
    with out.write() as tmp:
        (tmp / "config.json").write_text(json.dumps({"model_type": "ttt", "marker": marker}))
        (tmp / "model.safetensors").write_bytes(b"weights " + marker.encode())


def marker(path: Path) -> str:
    return json.loads((path / "config.json").read_text())["marker"]


def dead_pid() -> int:
    """The process id of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_force_replaces_a_model_directory_whole(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(outputs, "_exchange", lambda a, b: False)
    final = model_dir(tmp_path / "m")
    write_model(Output.plan(final, "model", force=True), "new")
    assert marker(final) == "new" and sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no staging left


def test_a_failed_run_leaves_the_old_output_and_no_staging(tmp_path):
    final = model_dir(tmp_path / "m")
    out = Output.plan(final, "model", force=True)
    with pytest.raises(RuntimeError):
        with out.write() as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("the work failed")
    assert marker(final) == "old" and [p.name for p in tmp_path.iterdir()] == ["m"]


def test_a_failed_run_removes_the_folders_it_made(tmp_path):
    out = Output.plan(tmp_path / "a" / "b" / "c.json", "json")
    with pytest.raises(RuntimeError):
        with out.write():
            raise RuntimeError("the work failed")
    assert list(tmp_path.iterdir()) == []


def test_the_staging_name_is_unpredictable_private_and_made_exclusively(tmp_path):
    names = []
    for _ in range(2):
        with Output.plan(tmp_path / "r.json", "json", force=True).write() as tmp:
            staging = tmp.parent
            names.append(staging.name)
            assert stat.S_IMODE(staging.stat().st_mode) == 0o700
            tmp.write_text("{}")
    assert names[0] != names[1] and all(n.startswith(f".r.json.edgettt-partial-{os.getpid()}-") for n in names)


def test_a_symlink_planted_at_the_old_temporary_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / f".r.json.tmp-{os.getpid()}").symlink_to(victim)  # where the old code wrote its temporary file
    with Output.plan(tmp_path / "r.json", "json").write() as tmp:
        tmp.write_text('{"a": 1}')
    assert victim.read_text() == "precious" and json.loads((tmp_path / "r.json").read_text()) == {"a": 1}


def test_outputs_get_the_usual_permissions(tmp_path):
    with Output.plan(tmp_path / "m", "model").write() as tmp:
        (tmp / "config.json").write_text("{}")
        os.chmod(tmp / "config.json", 0o600)  # as safetensors writes its files
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "m" / "config.json").stat().st_mode) == 0o666 & ~umask


def test_leftovers_of_a_killed_run_are_removed_by_the_next_run(tmp_path):
    staging = tmp_path / f".m{outputs.STAGING_TAG}{dead_pid()}-abc123"
    (staging / outputs.PUBLISHED).mkdir(parents=True)
    (staging / outputs.PUBLISHED / "config.json").write_text("{}")  # half a model
    live = tmp_path / f".m{outputs.STAGING_TAG}{os.getpid()}-def456"  # a run still working (this one)
    live.mkdir()
    Output.plan(tmp_path / "m", "model")
    assert not staging.exists() and live.exists()


def test_a_crash_between_the_two_renames_is_undone_by_the_next_run(tmp_path):
    """The fallback replacement parks the old output in the staging folder first; if the process dies
    before the new one is in place, nothing is at the final path: the next run puts the old one back."""
    staging = tmp_path / f".m{outputs.STAGING_TAG}{dead_pid()}-abc123"
    staging.mkdir()
    model_dir(staging / outputs.PARKED, "old")
    model_dir(staging / outputs.PUBLISHED, "new")
    Output.plan(tmp_path / "m", "model", force=True)
    assert marker(tmp_path / "m") == "old" and [p.name for p in tmp_path.iterdir()] == ["m"]


def test_kill_9_in_the_middle_leaves_no_output_and_the_next_run_cleans_up(tmp_path):
    """A real process killed with SIGKILL while it writes: the final path never holds a part."""
    ready = tmp_path / "ready"
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from edgettt.outputs import Output
        with Output.plan({str(tmp_path / 'm')!r}, "model").write() as tmp:
            (tmp / "config.json").write_text('{{"model_type": "ttt"}}')
            Path({str(ready)!r}).write_text("")
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(600):  # wait for the signal file, not for a time
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not (tmp_path / "m").exists()
    assert any(p.name.startswith(f".m{outputs.STAGING_TAG}") for p in tmp_path.iterdir())
    Output.plan(tmp_path / "m", "model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready"]


def test_recognise_only_what_edgettt_writes(tmp_path):
    model = model_dir(tmp_path / "m")
    assert recognise(model, "model") and not recognise(model, "export")
    (model / "notes.txt").write_text("mine")
    assert not recognise(model, "model")
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "x.json").write_text("not json")
    assert recognise(tmp_path / "r.json", "json") and not recognise(tmp_path / "x.json", "json")
    (tmp_path / "link").symlink_to(tmp_path / "r.json")
    assert not recognise(tmp_path / "link", "json")


def test_force_replaces_a_compare_directory_and_refuses_a_report(tmp_path):
    """`edgettt compare ... OUT --force` over an earlier comparison (its compare.json names the models); a folder
    of another kind is refused in one line (a compare folder once fell through to the report's check)."""
    compared = tmp_path / "c"
    compared.mkdir()
    (compared / "compare.json").write_text(json.dumps({"models": []}))
    assert recognise(compared, "compare") and not recognise(compared, "report")
    with Output.plan(compared, "compare", force=True).write() as tmp:
        (tmp / "compare.json").write_text(json.dumps({"models": [{"model": "x"}]}))
    assert json.loads((compared / "compare.json").read_text())["models"] == [{"model": "x"}]
    report = tmp_path / "r"
    report.mkdir()
    (report / "report.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(EdgetttError, match="is not an edgettt compare directory"):
        Output.plan(report, "compare", force=True)


def test_outputs_of_one_command_must_differ(tmp_path):
    with pytest.raises(EdgetttError, match="its own path"):
        plan_outputs((tmp_path / "a", "json", False, "--json"), (tmp_path / "a", "logits", False, "--save-logits"))
    a, none, b = plan_outputs((tmp_path / "a", "json", False, "--json"), (None, "json", False, "--x"),
                              (tmp_path / "b", "json", False, "--md"))
    assert none is None and a.path.name == "a" and b.path.name == "b"


def test_a_file_output_replaces_atomically(tmp_path):
    (tmp_path / "r.json").write_text('{"old": 1}')
    with Output.plan(tmp_path / "r.json", "json", force=True).write() as tmp:
        tmp.write_text('{"new": 1}')
    assert json.loads((tmp_path / "r.json").read_text()) == {"new": 1}


def test_an_output_rewrites_what_it_published_but_not_what_appeared_before(tmp_path):
    """A partial result (`bench` after each repetition) is replaced by the plan's next write without force;
    a file that appeared between planning and the first write is not."""
    out = Output.plan(tmp_path / "r.json", "json")
    for n in (1, 2):
        with out.write() as tmp:
            tmp.write_text(json.dumps({"repetitions": n}))
    assert json.loads((tmp_path / "r.json").read_text()) == {"repetitions": 2}
    late = Output.plan(tmp_path / "s.json", "json")
    (tmp_path / "s.json").write_text('{"theirs": 1}')
    with pytest.raises(EdgetttError, match="appeared or changed"):
        with late.write() as tmp:
            tmp.write_text('{"ours": 1}')
    assert json.loads((tmp_path / "s.json").read_text()) == {"theirs": 1}


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any permission bits")
def test_a_folder_that_cannot_be_written_is_found_before_the_work(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(EdgetttError, match="cannot write in"):
            Output.plan(folder / "m", "model")
    finally:
        folder.chmod(0o755)
