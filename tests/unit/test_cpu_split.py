"""The bench's CPU split by process group (swarmkv_bench.cpu_split) over a fake /proc: which
process counts where, threads born and gone between the two reads, and the idle cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from swarmkv_bench.cpu_split import (
    GROUP_ORDER,
    GROUPS,
    TICKS_PER_S,
    cpu_seconds,
    group_of,
    snapshot,
    with_idle,
)
from swarmkv_bench.serve_stats import cpu_per_token

ME = os.getpid()


def _thread(proc: Path, pid: int, tid: int, cmdline: str, ticks: tuple[int, int]) -> None:
    (proc / str(pid) / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode())
    # 13 fields after the command, then utime and stime; a command with spaces and parens
    fields = ["S", *["0"] * 10, str(ticks[0]), str(ticks[1]), "0", "0"]
    stat = f"{tid} (ray::Serve (x)) " + " ".join(fields)
    (proc / str(pid) / "task" / str(tid) / "stat").write_text(stat)


@pytest.mark.parametrize(
    ("cmdline", "group"),
    [
        ("ray::ServeReplica:swarmkv:SwarmKVEngine", "engine replicas"),
        ("ray::ServeReplica:swarmkv:SwarmKVIngress", "serve ingress"),
        ("ray::ProxyActor", "serve proxy"),
        ("ray::ServeController.listen_for_change", "ray other"),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x", "ray other"),
        ("/venv/bin/python -m swarmkv serve --port 1 -m m.gguf", "server"),
        ("/build/bin/llama-server -m m.gguf -np 16", "server"),
        ("/usr/sbin/sshd -D", "other"),
    ],
)
def test_each_process_counts_in_its_group(cmdline: str, group: str) -> None:
    assert group_of(cmdline, 1, ME) == group


def test_this_process_is_the_load_generator_whatever_its_command() -> None:
    assert group_of("swarmkv bench --serve", ME, ME) == "load generator"


def test_the_report_order_names_every_group_once() -> None:
    """The report's columns come from GROUP_ORDER: a group added to the matching table but
    not to the order would be measured and never shown."""
    reported = {group for _, group in GROUPS} | {"load generator", "other", "idle"}
    assert sorted(GROUP_ORDER) == sorted(reported)


def test_a_split_counts_what_each_thread_used_between_the_reads(tmp_path: Path) -> None:
    _thread(tmp_path, 10, 10, "ray::ServeReplica:swarmkv:SwarmKVEngine", (100, 20))
    _thread(tmp_path, 10, 11, "ray::ServeReplica:swarmkv:SwarmKVEngine", (5, 0))
    _thread(tmp_path, 20, 20, "/build/bin/llama-server -np 1", (7, 0))
    (tmp_path / "self").mkdir()  # not a pid: skipped
    before = snapshot(tmp_path)
    assert before[(10, 10)] == ("engine replicas", 120)
    _thread(tmp_path, 10, 10, "ray::ServeReplica:swarmkv:SwarmKVEngine", (150, 30))
    _thread(tmp_path, 10, 12, "ray::ServeReplica:swarmkv:SwarmKVEngine", (8, 2))  # born
    _thread(tmp_path, 30, 30, "ray::ProxyActor", (40, 10))  # a new process
    split = cpu_seconds(before, snapshot(tmp_path))
    assert split == {
        "engine replicas": (60 + 10) / TICKS_PER_S,
        "serve proxy": 50 / TICKS_PER_S,
    }  # llama-server used nothing: absent
    assert list(split) == ["engine replicas", "serve proxy"]  # largest first
    idle = with_idle(split, cores=2, wall_s=3.0)["idle"]
    assert idle == pytest.approx(6.0 - sum(split.values()))
    assert with_idle({"server": 9.0}, cores=2, wall_s=4.0)["idle"] == 0.0  # never negative


def test_the_summary_gives_cpu_per_token_for_each_group() -> None:
    runs = [
        {"tokens": 100, "cpu_s": {"server": 1.0, "idle": 0.5}},
        {"tokens": 200, "cpu_s": {"server": 4.0}},
        {"tokens": 0, "cpu_s": {"server": 1.0}},  # no tokens: no figure
        {"tokens": 50},  # measured nothing (no /proc)
    ]
    out = cpu_per_token(runs)
    assert out["server"] == [15.0, 10.0, 20.0]
    assert out["idle"] == [5.0, 5.0, 5.0]
