"""llama.cpp's own llama-server, built from the same patched tree and run with the
batch-invariant kernels (`server-*+inv`: LLAMA_BATCH_INVARIANT=1, weights not repacked),
decodes exactly the tokens of SwarmKV's batch-invariant baseline, one slot or one slot per
branch: the bench judges those peers strictly, as it does SwarmKV's own +inv modes. Skipped
when llama-server is not built (optional, never part of `pip install`; CI builds it)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from swarmkv_bench.peer_server import ENV_SERVER, find_llama_server

from support.proc import run, swarmkv_cmd

SERVER = find_llama_server(Path(__file__).resolve().parents[2])
PEERS = ("server-np1+inv", "server-npN+inv")

pytestmark = [
    pytest.mark.slow,  # the slow tier: the llama-server peers
    pytest.mark.peer,
    pytest.mark.skipif(
        SERVER is None, reason="llama-server not built (bash bench/build_llama_server.sh)"
    ),
]


def test_invariant_servers_decode_the_invariant_baselines_tokens(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    # 700 tokens: past Gemma 3's 512-token window, so the SWA layers' masks matter too
    args = ["--branches", "3", "--doc-tokens", "700", "-n", "12", "--trials", "1"]
    args += ["--warmup", "0", "--modes", ",".join(PEERS), "--no-memory-probe"]
    cmd = swarmkv_cmd("bench", *args, "--out", str(out), "-t", "2")
    proc = run(cmd, cwd=tmp_path, env={ENV_SERVER: str(SERVER)}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "all_trials.csv").open() as f:
        rows = {r["mode"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"baseline+inv", *PEERS}  # the reference joined the run by itself
    for peer in PEERS:
        detail = rows[peer]["fidelity_detail"]
        assert rows[peer]["fidelity_ok"] == "true", (peer, detail)
        assert detail.count("tokens equal") == 3, detail
