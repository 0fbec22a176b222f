"""Progress bars: on a terminal they show a rate and an estimate; off when not a terminal or asked."""

import io
import sys

import pytest

import edgettt
from edgettt.conversion import convert
from edgettt.distill import distill
from edgettt.progress import bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_on_a_terminal_shows_rate_and_estimate(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    for _ in bar(range(5), desc="work", unit="step"):
        pass
    shown = sys.stderr.getvalue()
    assert "work" in shown and "5/5" in shown and "step/s" in shown and "<" in shown  # [elapsed<left, rate]


@pytest.mark.parametrize("how", ["not a terminal", "TQDM_DISABLE"])
def test_no_bar_when_not_a_terminal_or_asked(monkeypatch, how):
    monkeypatch.setattr(sys, "stderr", io.StringIO() if how == "not a terminal" else Terminal())
    if how == "TQDM_DISABLE":
        monkeypatch.setenv("TQDM_DISABLE", "1")
    for _ in bar(range(5), desc="work"):
        pass
    assert sys.stderr.getvalue() == ""


def test_distillation_shows_its_steps_and_loss(monkeypatch, tiny_model):
    monkeypatch.setattr(sys, "stderr", Terminal())
    teacher = tiny_model()
    student = convert(teacher, "parallel")
    distill(teacher, student, list(range(61)) * 4, steps=3, batch=2, ctx=16, device="cpu")
    shown = sys.stderr.getvalue()
    assert "distill" in shown and "3/3" in shown and "loss=" in shown


def test_the_command_line_can_turn_bars_off(monkeypatch):
    from click.testing import CliRunner

    from edgettt.cli import cli

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    result = CliRunner().invoke(cli, ["--no-progress", "info", "ttt-linear-tiny"])
    assert result.exit_code == 0 and edgettt.__name__
    import os

    assert os.environ.get("TQDM_DISABLE") == "1"
    monkeypatch.delenv("TQDM_DISABLE")


def test_edgettt_progress_always_writes_lines_where_stderr_is_a_file(monkeypatch):
    """EDGETTT_PROGRESS=always: a log file (not a terminal) still gets the bar, as whole lines, the last one
    the finished count; without it the same file gets nothing (the test above)."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv("EDGETTT_PROGRESS", "always")
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    for _ in bar(range(5), desc="work", unit="step"):
        pass
    lines = sys.stderr.getvalue().splitlines()
    assert lines and "\r" not in sys.stderr.getvalue() and "work" in lines[-1] and "5/5" in lines[-1]


def test_a_log_gets_no_terminal_escape_codes(monkeypatch):
    """A nested bar (leave=False) makes tqdm move the cursor and erase lines: in a log those escape codes are
    noise, so the line writer drops them."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv("EDGETTT_PROGRESS", "always")
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    for _ in bar(range(2), desc="outer"):
        for _ in bar(range(3), desc="inner", leave=False):
            pass
    text = sys.stderr.getvalue()
    assert "outer" in text and "\x1b" not in text and "\r" not in text
