"""Measurements of the machine itself: /proc status fields, memcpy bandwidth.

The machine's description (CPU, build, devices) comes from swarmkv.info()."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def proc_status_bytes(key: str, pid: int | str = "self") -> int | None:
    """A kB field of /proc/PID/status (VmRSS, VmHWM, RssAnon, ...) in bytes; None when the
    process or the field is not there (the one reader of that file in SwarmKV)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return None


def rss_bytes() -> int:
    """This process's resident set size (VmRSS) in bytes; 0 where /proc is not there."""
    return proc_status_bytes("VmRSS") or 0


def memcpy_ms(nbytes: int, repeats: int = 7) -> float:
    """Best time to copy nbytes between two warm buffers on this machine."""
    src = np.ones(max(nbytes, 1), dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter_ns()
        np.copyto(dst, src)
        best = min(best, (time.perf_counter_ns() - t) / 1e6)
    return best
