"""`swarmkv bench --serve` end to end on the tiny model: every system answers every agent,
SwarmKV's answers equal the same requests sent alone, and serve.json carries provenance,
the targets and the summary the results page reads (llama-server peers when CI built it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.proc import run, swarmkv_cmd

pytestmark = pytest.mark.slow


@pytest.mark.peer  # with llama-server when CI built it
def test_serve_bench_writes_a_complete_result(tiny_model_path: Path, tmp_path: Path) -> None:
    peers = "all" if os.environ.get("SWARMKV_LLAMA_SERVER") else "none"
    cmd = swarmkv_cmd(
        "bench",
        "--serve",
        "-m",
        str(tiny_model_path),
        "--agents",
        "4",
        "--rates",
        "4",
        "--trials",
        "2",
        "--doc-tokens",
        "200",
        "-n",
        "4",
        "--peers",
        peers,
        "--probes",
        "3",
        "--out",
        str(tmp_path),
    )
    proc = run(cmd, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "serve.json").read_text())
    assert result["provenance"]["command"].startswith("swarmkv bench --serve")
    assert len(result["trials"]) == 2
    for trial in result["trials"]:
        systems = {s["system"]: s for s in trial["systems"]}
        assert ("server-np1" in systems) == (peers == "all")
        for s in systems.values():
            assert s["errors"] == 0 and len(s["agents"]) == 4
            assert all(a["completion_tokens"] >= 1 for a in s["agents"])
        mine = systems["swarmkv"]
        assert mine["identical_to_alone"] == mine["compared"] == 4
        assert mine["cached_tokens_mean"] >= 190  # the warmed head, read from the cache
    oh = result["http_overhead"]
    tok = oh["tokenize_ms"]
    assert len(oh["serve_ttft_ms"]) == len(tok["whole_ms"]) == len(tok["server_ms"]) == oh["reps"]
    assert all(ms > 0 for ms in tok["whole_ms"] + tok["server_ms"])
    assert set(result["summary"]["swarmkv"]) >= {"ttft_p99_ms", "tokens_per_s"}
    assert "HTTP overhead" in proc.stdout


def test_overhead_only_writes_the_probe_alone(tiny_model_path: Path, tmp_path: Path) -> None:
    cmd = swarmkv_cmd(
        "bench", "--serve", "--overhead-only", "-m", str(tiny_model_path), "--trials", "2",
        "--doc-tokens", "200", "--probes", "4", "--out", str(tmp_path),
    )  # fmt: skip
    proc = run(cmd, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "serve-overhead.json").read_text())
    assert set(result) == {"provenance", "setup", "http_overhead_trials", "summary"}
    assert len(result["http_overhead_trials"]) == 2
    for oh in result["http_overhead_trials"]:
        assert oh["reps"] == 4 == len(oh["serve_ttft_ms"]) == len(oh["server_internal_ttft_ms"])
        # the server's own time to first token is part of what the client waited
        pairs = zip(oh["server_internal_ttft_ms"], oh["serve_ttft_ms"], strict=True)
        assert all(0 < served < client for served, client in pairs)
    medians = sorted(t["median_overhead_ms"] for t in result["http_overhead_trials"])
    med, lo, hi = result["summary"]["median_overhead_ms"]
    assert (lo, hi) == (medians[0], medians[-1]) and lo <= med <= hi
    assert proc.stdout.count("HTTP overhead within 10 ms") == 3  # each trial, then all
    assert not (tmp_path / "serve.json").exists()
