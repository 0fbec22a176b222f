"""Progress bars for every step that takes more than a few seconds (tqdm, to stderr).

A bar shows a rate and an estimate of the time left; it is off when stderr is not a terminal, and
when asked: `edgettt --no-progress ...` or the environment variable TQDM_DISABLE=1 (tqdm reads it).
EDGETTT_PROGRESS=always keeps it on where stderr is a file or a pipe (a new line of it at most every
20 seconds), so that a run stopped by a time limit still shows where it was.
"""

from __future__ import annotations

import os
import re
import sys

from tqdm import tqdm


def bar(iterable=None, total: int | None = None, desc: str = "", unit: str = "it", leave: bool = True) -> tqdm:
    """A tqdm bar on stderr, disabled when stderr is not a terminal (`disable=None`) or by TQDM_DISABLE
    (read here, at each bar: tqdm itself reads it once, when it is imported)."""
    asked_off = os.environ.get("TQDM_DISABLE", "").lower() not in ("", "0", "false")
    if asked_off:
        return tqdm(iterable, total=total, disable=True)
    if os.environ.get("EDGETTT_PROGRESS", "") == "always" and not sys.stderr.isatty():
        return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, disable=False, file=LineWriter(),
                    mininterval=20, ncols=100)
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, disable=None, file=sys.stderr,
                dynamic_ncols=True)


ESCAPE_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class LineWriter:
    """A file for tqdm that turns its carriage-return redraws into lines on stderr (a log keeps each),
    without the terminal's escape codes (cursor moves, erases) a log would show as noise."""

    def write(self, text: str) -> None:
        text = ESCAPE_CODES.sub("", text).replace("\r", "").strip()
        if text:
            print(text, file=sys.stderr, flush=True)

    def flush(self) -> None:
        sys.stderr.flush()
