"""`swarmkv bench --swarm` on the real model, small: it runs every system on the same
arrivals, every system's tokens equal the host lock's (batch-invariant), and it writes its
report, CSV and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.proc import run, swarmkv_cmd

pytestmark = pytest.mark.slow  # the slow tier: a benchmark run


def test_swarm_bench_runs_and_every_system_answers_the_same(tmp_path: Path) -> None:
    args = ["--swarm", "--rates", "6", "--agents", "6", "--n-range", "3,6", "--doc-tokens", "200"]
    # the llama-server peers have their own test (test_swarm_peers_real.py)
    args += ["--max-live", "3", "-t", "2", "--peers", "none", "--out", str(tmp_path / "out")]
    proc = run(swarmkv_cmd("bench", *args), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "swarm.json").read_text())
    systems = report["rates"][0]["systems"]
    assert set(systems) == {"host-lock", "swarm-fifo", "swarm-fair", "swarm-priority"}
    for name, s in systems.items():
        assert s["tokens_identical_to_host_lock"], name
        assert s["n_branches"] == 6 and s["activation_ms"]["p99"] > 0
    assert (tmp_path / "out" / "swarm_report.md").exists()
    assert "Jain's index of slowdown" in proc.stdout
