"""`swarmkv bench --swarm` with llama.cpp's llama-server as peers, for real and small: 3 agents
arriving at once-ish, 4 tokens each, a 200-token document, host lock, the fair swarm and every
server setup on the same arrivals. Skipped when llama-server is not built (it is optional,
never part of `pip install`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from swarmkv import default_model_path
from swarmkv_bench.peer_server import find_llama_server
from swarmkv_bench.swarm_bench import SwarmBenchOptions, run_swarm_bench

SERVER = find_llama_server(Path(__file__).resolve().parents[2])
PEERS = ("server-np1", "server-npN", "server-npNslots")

pytestmark = [
    pytest.mark.slow,  # the slow tier: the llama-server peers
    pytest.mark.peer,
    pytest.mark.skipif(
        SERVER is None, reason="llama-server not built (bash bench/build_llama_server.sh)"
    ),
]


def test_peers_replay_the_same_arrivals(tmp_path: Path) -> None:
    opts = SwarmBenchOptions(
        model_path=default_model_path(), rates=(20.0,), agents=3, n_min=4, n_max=4, seed=0,
        policies=("fair",), max_live=3, doc_tokens=200, threads=2, out_dir=tmp_path,
        command="test", peers=("np1", "npN", "npNslots"), peer_bin=SERVER,
    )  # fmt: skip
    systems = run_swarm_bench(opts)["rates"][0]["systems"]
    assert set(systems) == {"host-lock", "swarm-fair", *PEERS}
    for name in PEERS:
        s = systems[name]
        assert s["failed_branches"] == 0 and s["n_branches"] == 3, name
        assert 0 <= s["tokens_identical_fraction"] <= 1  # reported, never required
        assert s["tokens"] > 0 and s["tokens_per_s"] > 0 and 0 < s["fairness"] <= 1
        for b in s["branches"]:
            assert 0 <= b["queue_ms"] < b["activation_ms"] <= b["completion_ms"], (name, b)
            assert 1 <= len(b["tokens"]) <= 4 and math.isfinite(b["completion_ms"])
    # np1 had the document in its slot's cache before the first arrival: no arrival
    # evaluates it again, while each npN slot prefills it itself.
    np1, npn = systems["server-np1"], systems["server-npN"]
    assert np1["warmup_prompt_tokens_evaluated"] >= 200
    assert np1["prompt_tokens_evaluated"] < 200 <= npn["prompt_tokens_evaluated"]
    assert np1["n_parallel"] == 1 and npn["n_parallel"] == 3
    report = (tmp_path / "swarm_report.md").read_text()
    assert "tokens/s: swarm-fair / server-np1" in report and "| server-npNslots |" in report
