"""How many threads a torch command takes by default: the cores other work leaves free now (Linux's /proc/stat),
not torch's one a physical core whatever else runs (docs/cli.md measures the difference)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def idle_cores(torch_default: int) -> int:
    """torch's default threads less the cores other work keeps busy now."""
    cores = os.cpu_count() or 1
    return default_torch_threads(cores, busy_cores(cores), torch_default)


def default_torch_threads(cores: int, load: float, torch_default: int) -> int:
    """torch's default (one per physical core) less the cores other work keeps busy (`load`, from
    `busy_cores`): threads that wait for a busy core cost more than they give (the README measures it)."""
    return max(1, min(torch_default, round(cores - load)))


def busy_cores(cores: int, interval: float = 0.05) -> float:
    """How many cores other work keeps busy now: the share of CPU time that was not idle over `interval`
    seconds (Linux's /proc/stat; this process sleeps meanwhile), times the cores. Elsewhere the 1-minute load
    average, which lags: right after another run ends it still counts that run."""
    try:
        first = idle_and_total(Path("/proc/stat").read_text())
        time.sleep(interval)
        second = idle_and_total(Path("/proc/stat").read_text())
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    idle, total = second[0] - first[0], second[1] - first[1]
    return cores * (1 - idle / total) if total > 0 else 0.0


def idle_and_total(proc_stat: str) -> tuple[int, int]:
    """(idle, total) CPU time of all cores from /proc/stat's first line (`cpu user nice system idle iowait irq
    softirq steal ...`): waiting for I/O counts as idle; guest time is already inside user time."""
    fields = [int(x) for x in proc_stat.splitlines()[0].split()[1:9]]
    return fields[3] + fields[4], sum(fields)
