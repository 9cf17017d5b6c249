"""`swarmkv bench --serve` end to end on the tiny model: every system answers every agent,
SwarmKV's answers equal the same requests sent alone, and serve.json carries provenance,
the targets and the summary the results page reads (llama-server peers when CI built it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from unit.vendor_scripts import load

from swarmkv_bench.serve_systems import parse_stamp

from support.proc import run, swarmkv_cmd

pytestmark = [pytest.mark.slow, pytest.mark.serve]


SMALL = ("--agents", "4", "-n", "4", "--doc-tokens", "200", "--multiturn", "3x3",
         "--groups", "2x2", "--group-tokens", "100", "--cold-tokens", "60")  # fmt: skip


def _bench(model: Path, out: Path, *args: str) -> tuple[dict[str, Any], str]:
    cmd = swarmkv_cmd("bench", "--serve", "-m", str(model), *SMALL, *args, "--out", str(out))
    proc = run(cmd, cwd=out, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "serve.json").read_text()), proc.stdout


def _runs(result: dict[str, Any], workload: str) -> list[dict[str, Any]]:
    return result["workloads"][workload]["runs"]


@pytest.mark.peer  # with llama-server when CI built it
def test_serve_bench_against_every_peer(tiny_model_path: Path, tmp_path: Path) -> None:
    peers = "all" if os.environ.get("SWARMKV_LLAMA_SERVER") else "none"
    result, stdout = _bench(
        tiny_model_path, tmp_path, "--workloads", "shared,multiturn", "--rates", "4",
        "--trials", "2", "--kernels", "exact", "--peers", peers, "--probes", "3",
    )  # fmt: skip
    assert result["provenance"]["command"].startswith("swarmkv bench --serve")
    want = {"swarmkv"} | (
        {"server-np1", "server-np16", "server-np16-unified", "server-np16-restore"}
        if peers == "all"
        else set()
    )
    for name, agents in (("shared", 4), ("multiturn", 3)):
        runs = _runs(result, name)
        assert {r["system"] for r in runs} == want and {r["seed"] for r in runs} == {0, 1}
        for r in runs:  # every request answered, its server's counts read
            errors = [q["error"] for q in r["requests_log"] if q["error"]]
            assert r["errors"] == 0, (name, r["system"], r["seed"], errors[:3])
            assert r["requests"] == agents * (3 if name == "multiturn" else 1)
            assert r["prompt_tokens_reused"] > 0 and r["peak_rss_bytes"] > 0
            assert r["command"]["kernels"] == "exact"
        mine = [r for r in runs if r["system"] == "swarmkv"]
        assert all(r["identical_to_alone"] == r["compared"] == r["requests"] for r in mine)
    # every slot of the restored peer held the head (200 tokens) when the clock started
    restored = [r for r in _runs(result, "shared") if r["system"] == "server-np16-restore"]
    assert all(q["cached_tokens"] >= 195 for r in restored for q in r["requests_log"])
    turns = [q for r in _runs(result, "multiturn") for q in r["requests_log"] if q["turn"] == 2]
    assert turns and all(q["cached_tokens"] > 200 for q in turns)  # its history, reused
    if peers == "all":
        assert result["peer_binary"]["build_flags"]["GGML_NATIVE"] in ("ON", "OFF")
        # built by bench/build_llama_server.sh from the vendored tree: its patches are the
        # series as the fetch script stamps it (each patch with its file's hash)
        fetch = load("fetch_llama_cpp")
        stamped = parse_stamp(fetch.stamp_text(fetch.read_lock()))["patches"]
        assert result["peer_binary"]["tree"]["patches"] == stamped
        assert {t["workload"] for t in result["targets"]} == {"shared", "multiturn"}
        assert all(t["per_seed"] and len(t["per_seed"]) == 2 for t in result["targets"])
    oh = result["http_overhead"]
    tok = oh["tokenize_ms"]
    assert len(oh["serve_ttft_ms"]) == len(tok["whole_ms"]) == len(tok["server_ms"]) == oh["reps"]
    assert all(ms > 0 for ms in tok["whole_ms"] + tok["server_ms"])
    assert "HTTP overhead" in stdout
    report = (tmp_path / "serve_report.md").read_text()
    # per workload: swarmkv's row in its figures table and in its CPU-per-token table
    assert report.count("| swarmkv/exact |") == 4
    assert report.count("CPU ms per generated token") == 2


def test_serve_bench_every_workload_both_kernels_and_a_burst(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    result, _ = _bench(
        tiny_model_path, tmp_path, "--rates", "2", "--burst", "--trials", "1",
        "--kernels", "exact,plain", "--peers", "none", "--skip-overhead",
    )  # fmt: skip
    assert set(result["workloads"]) == {"shared", "multiturn", "groups", "cold"}
    assert "http_overhead" not in result
    for work in result["workloads"].values():
        assert [e["rate"] for e in work["by_rate"]] == [2.0, "burst"]
        assert set(work["by_rate"][0]["summary"]) == {"swarmkv/exact", "swarmkv/plain"}
        for r in work["runs"]:
            assert r["errors"] == 0
            if r["kernels"] == "exact":
                assert r["identical_to_alone"] == r["compared"] == r["requests"]
            if r["rate"] == "burst":  # the capacity every utilization is measured against
                assert r["utilization"] is None and r["tokens_per_s"] == r["capacity_tokens_per_s"]
            else:
                assert 0 < r["utilization"] <= 1
    reused = {
        n: sum(r["prompt_tokens_reused"] for r in _runs(result, n)) for n in result["workloads"]
    }
    computed = {
        n: sum(r["prompt_tokens_computed"] for r in _runs(result, n)) for n in result["workloads"]
    }
    assert reused["groups"] > computed["groups"]  # each group's head served from the cache
    assert computed["cold"] > 4 * reused["cold"]  # nothing to share (a few words of "Record")
    for r in (r for n in result["workloads"] for r in _runs(result, n)):
        assert r["cpu_s"]["server"] > 0 and r["cpu_s"]["load generator"] > 0
        assert r["cpu_s"]["idle"] >= 0
    assert "CPU ms per generated token" in (tmp_path / "serve_report.md").read_text()
    for png in ("shared_ttft_cdf", "cold_ttft_cdf"):
        assert (tmp_path / "plots" / f"serve_{png}.png").stat().st_size > 0


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


def test_serve_bench_warms_every_ray_replica_and_splits_a_burst(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """--ray: swarmkv-ray2 is warmed on both replicas (POST /v1/warm), so a burst computes no
    head again there, spreads over both, and answers as one server does."""
    result, _ = _bench(
        tiny_model_path, tmp_path, "--workloads", "shared", "--agents", "8", "--burst",
        "--rates", "2", "--trials", "1", "--kernels", "exact", "--peers", "none", "--ray",
        "--skip-overhead",
    )  # fmt: skip
    runs = {(r["system"], r["rate"]): r for r in _runs(result, "shared")}
    for rate in (2.0, "burst"):
        one, two = runs["swarmkv", rate], runs["swarmkv-ray2", rate]
        assert one["errors"] == two["errors"] == 0
        # the head (200 tokens) was held on every replica: each agent reuses it
        cached = [q["cached_tokens"] for q in two["requests_log"]]
        assert min(cached) >= 195, cached
        split = two["requests_per_replica"]
        assert len(split) == 2 and sum(split) == 8, split
        assert "requests_per_replica" not in one
        # where the cores went: one server process, against the replicas and Serve's own
        assert one["cpu_s"]["server"] > 0 and "engine replicas" not in one["cpu_s"]
        assert two["cpu_s"]["engine replicas"] > 0 and two["cpu_s"]["serve ingress"] > 0
    # a head both replicas hold is no reason to favour one: the burst goes 4:4, or 5:3 when
    # Serve's queue lengths lag (affinity.py; it went 6:2 when a question's first words won)
    assert min(runs["swarmkv-ray2", "burst"]["requests_per_replica"]) >= 3
    same = [t for t in result["targets"] if t["target"].startswith("answers of swarmkv-ray2")]
    assert same and all(t["pass"] for t in same), same
