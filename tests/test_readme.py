"""The README runs verbatim: every `edgettt` command and the Python snippet, in a temporary folder, on
the shipped models; and its table of commands lists exactly the options each command's --help has."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
from conftest import check_genai_generates_what_edgettt_run_generates

from edgettt.cli import cli

README = Path(__file__).parent.parent / "README.md"
NOT_RUN = ("bash .ci/run",)  # the test command itself
INSTALL = re.compile(r"^python3 -m venv .* && pip install -e \. && (?P<rest>.*)$")


def blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def commands() -> list[str]:
    """Every shell command of the README's bash blocks, continuation lines joined; the install steps
    in front of the main job are left to CI (which makes a fresh environment) and the rest kept."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split())
            if not line or line in NOT_RUN:
                continue
            install = INSTALL.match(line)
            out.append(install.group("rest") if install else line)
    return out


def environment() -> dict:
    env = dict(os.environ, TQDM_DISABLE="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this environment's edgettt
    return env


def test_every_readme_command_and_the_snippet_run_verbatim(tmp_path):
    cmds = commands()
    assert all(c.startswith("edgettt ") for c in cmds), cmds
    assert any(c.startswith("edgettt report") for c in cmds) and any(c.startswith("edgettt run") for c in cmds)
    main_job, rest = cmds[0], cmds[1:]
    assert main_job.startswith("edgettt report")
    # the main job alone on one core, the other commands (which depend on each other) beside it
    env = environment()
    background = subprocess.Popen(main_job, shell=True, cwd=tmp_path, env=dict(env, OMP_NUM_THREADS="1"),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for cmd in rest:
            done = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
        for snippet in blocks("python"):
            done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=900)
            assert done.returncode == 0, f"{snippet}\n{done.stdout}\n{done.stderr}"
        output, _ = background.communicate(timeout=900)
    finally:
        background.kill()
    assert background.returncode == 0, output
    check_the_sample_table_is_what_the_main_job_prints(output)
    assert (tmp_path / "edgettt-report" / "report.html").exists() and (tmp_path / "onnx-int4" / "manifest.json").exists()
    # the README's int4 export in onnxruntime-genai: the tokens `edgettt run` gives (tests/test_runtimes.py
    # checks the float TTT-Linear, TTT-MLP and LaCT exports)
    check_genai_generates_what_edgettt_run_generates(tmp_path / "onnx-int4", tmp_path)


ROW = re.compile(r"^(?P<variant>\S.*?)\s{2,}(?P<weights>\S+)\s+(?P<state>\S+)\s+(?P<mb>\d+\.\d+)\s+"
                 r"(?P<bits>\d+\.\d+)\s+(?P<ppl>\d+\.\d+)\s", re.M)


def check_the_sample_table_is_what_the_main_job_prints(output: str) -> None:
    """The README's sample output of the main job: the same variants, formats, sizes and bits per weight, and
    perplexities within 0.5% (another CPU rounds the float sums in another order)."""
    sample = re.search(r"^```\n(reference logits.*?)^```", README.read_text(), flags=re.S | re.M).group(1)
    shown, printed = ROW.findall(sample), ROW.findall(output)
    assert [r[:5] for r in shown] == [r[:5] for r in printed], output
    assert all(abs(float(a[5]) / float(b[5]) - 1) < 0.005 for a, b in zip(shown, printed)), output


def options_of(command: click.Command) -> set[str]:
    return {o for p in command.params if isinstance(p, click.Option) and not p.hidden
            for o in p.opts + p.secondary_opts if o.startswith("--")} - {"--help"}  # (secondary: --no-...)


def test_the_commands_table_lists_every_option_of_every_command():
    table = README.read_text().split("## Commands", 1)[1].strip().split("\n\n", 1)[0]
    rows = re.findall(r"^\| `edgettt (\w+) ([^`]*)` \|", table, flags=re.M)
    assert {name for name, _ in rows} == set(cli.commands)
    for name, usage in rows:
        listed = set(re.findall(r"--[a-z0-9-]+", usage))
        assert listed == options_of(cli.commands[name]), (name, listed ^ options_of(cli.commands[name]))


def test_the_readme_stays_within_200_lines():
    """The README is the front page: what does not fit goes to docs/ (the house issue's bound)."""
    assert len(README.read_text().splitlines()) <= 200
