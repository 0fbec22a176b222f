"""Progress bars for every step that takes more than a few seconds (tqdm, to stderr).

A bar shows a rate and an estimate of the time left; it is off when stderr is not a terminal, and
when asked: `edgettt --no-progress ...` or the environment variable TQDM_DISABLE=1 (tqdm reads it).
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


def bar(iterable=None, total: int | None = None, desc: str = "", unit: str = "it", leave: bool = True) -> tqdm:
    """A tqdm bar on stderr, disabled when stderr is not a terminal (`disable=None`) or by TQDM_DISABLE
    (read here, at each bar: tqdm itself reads it once, when it is imported)."""
    asked_off = os.environ.get("TQDM_DISABLE", "").lower() not in ("", "0", "false")
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, disable=True if asked_off else None,
                file=sys.stderr, dynamic_ncols=True)
