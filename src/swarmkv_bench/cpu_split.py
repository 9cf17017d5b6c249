"""Where the cores went while a load ran: CPU seconds per process group, read from /proc
(Linux) before and after, over every process on the machine (the bench runs on an idle one).

It answers what a tokens/s ratio cannot: whether a slower system spent its cores on the model
(the engine), on carrying requests and tokens (an HTTP layer, Ray Serve's proxy and ingress),
or left them idle. perf would name functions; this names processes, needs no privileges and
costs two passes over /proc.

| group            | processes                                                      |
|------------------|----------------------------------------------------------------|
| server           | a single `swarmkv serve` or llama-server process (all of it)   |
| engine replicas  | Ray Serve replicas of the engine deployment                    |
| serve ingress    | the Ray Serve replica of the HTTP app (FastAPI, the router)    |
| serve proxy      | Ray Serve's HTTP proxy actor                                   |
| ray other        | Ray's controller, raylet, GCS, idle workers, dashboard          |
| load generator   | this process (the openai client's agents)                      |
| other            | everything else on the machine                                 |
| idle             | the cores' time no thread used (cores × wall time − the rest)  |

Under `--ray-replicas`, `server` is the CLI process that deployed the replicas.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from swarmkv.llama.config import default_threads

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# first match wins: (words all in the command line, group)
GROUPS: list[tuple[tuple[str, ...], str]] = [
    (("ServeReplica", "Engine"), "engine replicas"),
    (("ServeReplica", "Ingress"), "serve ingress"),
    (("ProxyActor",), "serve proxy"),
    (("ray::",), "ray other"),
    (("/ray/",), "ray other"),
    (("swarmkv", "serve"), "server"),
    (("llama-server",), "server"),
]

# every group this module reports, in the order of the module table (a report's columns)
GROUP_ORDER: tuple[str, ...] = (
    "server",
    "engine replicas",
    "serve ingress",
    "serve proxy",
    "ray other",
    "load generator",
    "other",
    "idle",
)


def group_of(cmdline: str, pid: int, me: int) -> str:
    """The group of a process by its command line (the module table)."""
    if pid == me:
        return "load generator"
    for words, group in GROUPS:
        if all(w in cmdline for w in words):
            return group
    return "other"


def _ticks(stat: str) -> int:
    """utime + stime of a /proc/.../stat line (fields 14 and 15, after the command's parens)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def snapshot(proc: Path = PROC) -> dict[tuple[int, int], tuple[str, int]]:
    """(pid, tid) -> (group, CPU ticks so far) for every thread on the machine. A process or
    thread that ends while it is read is left out."""
    me, out = os.getpid(), {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            group = group_of(cmdline, pid, me)
            for task in (entry / "task").iterdir():
                out[(pid, int(task.name))] = (group, _ticks((task / "stat").read_text()))
        except (OSError, ValueError):
            continue
    return out


def cpu_seconds(
    before: dict[tuple[int, int], tuple[str, int]], after: dict[tuple[int, int], tuple[str, int]]
) -> dict[str, float]:
    """CPU seconds per group between two snapshots: a thread born in between counts whole,
    one that died in between is lost (its process's own total keeps what it reaped)."""
    total: dict[str, float] = {}
    for key, (group, ticks) in after.items():
        start = before[key][1] if key in before else 0
        if ticks > start:
            total[group] = total.get(group, 0.0) + (ticks - start) / TICKS_PER_S
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def with_idle(seconds: dict[str, float], cores: int, wall_s: float) -> dict[str, float]:
    """seconds plus `idle`: what the cores had over wall_s that no thread used."""
    return {**seconds, "idle": max(0.0, cores * wall_s - sum(seconds.values()))}


@dataclass
class Split:
    """Filled when its with-block ends: CPU seconds per group, idle included."""

    seconds: dict[str, float] = field(default_factory=dict)


@contextmanager
def measured(proc: Path = PROC) -> Iterator[Split]:
    """CPU seconds per group while the with-block runs (empty where /proc is missing)."""
    split = Split()
    if not proc.is_dir():
        yield split
        return
    before, start = snapshot(proc), time.monotonic()
    yield split
    after, wall_s = snapshot(proc), time.monotonic() - start
    split.seconds = with_idle(cpu_seconds(before, after), default_threads(), wall_s)
