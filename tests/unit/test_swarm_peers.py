"""llama-server peers of `swarmkv bench --swarm` without llama-server: the arrivals replayed
against the fake server (fake_llama_server.py), each request turned into the swarm's
per-branch record, the setups' server configs, and which peers --peers selects."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fake_llama_server import EOG_ID, TOKEN_DELAY_S, FakeServer, fake_tokens, serving

from swarmkv.errors import ConfigError
from swarmkv_bench.modes import peer_setups
from swarmkv_bench.swarm_arrivals import Arrival
from swarmkv_bench.swarm_peers import PeerBench, replay_to_server, run_peer, select_peers

DOC = "The quick brown fox jumps over the lazy dog. " * 3
STEP_MS = TOKEN_DELAY_S * 1000


def _arrivals(*prompts: str, gap_s: float = 0.01, n_predict: int = 4) -> list[Arrival]:
    return [Arrival(i, i * gap_s, p, n_predict, i % 3) for i, p in enumerate(prompts)]


def _prompts(server: FakeServer) -> list[tuple[str, int]]:
    return [(body["prompt"], body["n_predict"]) for body, *_ in server.requests]


def test_np1_warms_the_document_then_queues_the_arrivals() -> None:
    arrivals = _arrivals(" one?", " two?", " three?")
    with serving(slots=1) as server:
        run = replay_to_server(server.base_url, DOC, arrivals, [5, 6, 7], warm=True, timeout_s=10)
        sent = _prompts(server)
    # The warm-up (document alone, one token) went first and is in no result.
    assert sent[0] == (DOC, 1) and sorted(sent[1:]) == sorted((DOC + a.prompt, 4) for a in arrivals)
    assert run.extra["warmup_prompt_tokens_evaluated"] == len(DOC)
    assert run.extra["prompt_tokens_cached"] >= 3 * len(DOC)  # every arrival reused it
    r = run.results
    assert [x.name for x in r] == ["a0", "a1", "a2"] and [x.prompt_tokens for x in r] == [5, 6, 7]
    for x, a in zip(r, arrivals, strict=True):
        assert x.tokens == tuple(fake_tokens(DOC + a.prompt, 4)) and x.stop_reason == "length"
        assert x.priority == a.priority and x.arrival_s == a.t_s and x.text == "xxxx"
        assert 0 <= x.queue_ms < x.activation_ms < x.completion_ms
        assert len(x.inter_token_ms) == 3 and min(x.inter_token_ms) >= 0.8 * STEP_MS
    # One slot: each later arrival waits in the queue for those before it (4 tokens each).
    assert r[0].queue_ms < 2 * STEP_MS
    assert r[1].queue_ms > 2 * STEP_MS and r[2].queue_ms > r[1].queue_ms + 2 * STEP_MS
    assert run.wall_s * 1000 >= r[2].arrival_s * 1000 + r[2].completion_ms * 0.99


def test_npn_sends_no_warm_up_and_serves_arrivals_at_once() -> None:
    arrivals = _arrivals(" one?", " two?", " three?", gap_s=0.0)
    with serving() as server:
        run = replay_to_server(server.base_url, DOC, arrivals, [1, 1, 1], warm=False, timeout_s=10)
        sent = _prompts(server)
    assert len(sent) == 3 and all(n == 4 for _, n in sent)  # no warm-up request
    assert "warmup_prompt_tokens_evaluated" not in run.extra
    assert max(x.queue_ms for x in run.results) < 2 * STEP_MS
    assert run.wall_s < 3 * 4 * TOKEN_DELAY_S  # concurrent: less than three in turn


def test_closing_eog_id_is_dropped_and_a_failed_request_recorded() -> None:
    arrivals = _arrivals(" EOS soon", " FAIL here", " fine", n_predict=6)
    with serving() as server:
        run = replay_to_server(server.base_url, DOC, arrivals, [1, 1, 1], warm=False, timeout_s=10)
    eos, failed, fine = run.results
    # The server streams the end-of-generation id; the host lock stops there uncounted.
    assert eos.stop_reason == "eog" and EOG_ID not in eos.tokens and len(eos.tokens) == 2
    assert len(eos.inter_token_ms) == 2  # its time still counts, as the host lock's does
    assert failed.stop_reason.startswith("error: PeerRequestError: HTTP 500")
    assert failed.tokens == () and math.isnan(failed.activation_ms)
    assert math.isnan(failed.queue_ms) and math.isnan(failed.completion_ms)
    assert fine.stop_reason == "length" and len(fine.tokens) == 6
    assert run.extra["failed_branches"] == 1 and run.extra["token_ids_withheld"] == 0


class _CharTokenizer:
    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_each_setup_gets_its_own_server_shape() -> None:
    bench = PeerBench(Path("/bin/llama-server"), Path("/m/model.gguf"), threads=2, max_live=4)
    np1, npn, slots = (bench.config(s, 300, 32) for s in ("np1", "npN", "npNslots"))
    assert (np1.n_parallel, np1.kv_unified) == (1, False) and np1.n_ctx >= 300 + 32
    assert (npn.n_parallel, npn.kv_unified) == (4, True) and npn.n_ctx >= 4 * (300 + 32)
    assert (slots.n_parallel, slots.kv_unified) == (4, False) and slots.n_ctx % 4 == 0
    assert slots.n_ctx // 4 >= 300 + 32  # -c is split over the slots
    assert all(c.swa_full and c.n_batch == 512 for c in (np1, npn, slots))


def test_run_peer_starts_a_server_replays_and_stops_it(fake_binary: Path) -> None:
    bench = PeerBench(fake_binary, Path("/m/model.gguf"), threads=1, max_live=2)
    arrivals = _arrivals(" one?", " two?")
    run = run_peer(bench, "np1", DOC, arrivals, _CharTokenizer(), [2, 2])
    assert [x.tokens for x in run.results] == [
        tuple(fake_tokens(DOC + a.prompt, 4)) for a in arrivals
    ]
    assert run.extra["n_parallel"] == 1 and run.extra["server_start_ms"] > 0
    assert run.extra["n_ctx"] >= len(DOC + " one?") + 4
    assert run.extra["warmup_prompt_tokens_evaluated"] == len(DOC)


def test_which_peers_run() -> None:
    built = Path("/bin/llama-server")
    assert select_peers(None, built) == ("np1", "npN", "npNslots")
    assert select_peers(None, None) == ()  # not built: skipped, with a warning
    assert select_peers("none", None) == ()
    assert select_peers("np1,server-npN", built) == ("np1", "npN")
    with pytest.raises(ConfigError, match=r"build_llama_server\.sh"):
        select_peers("np1", None)
    with pytest.raises(ConfigError, match="np1"):
        peer_setups("np4")
    assert peer_setups("all") == ("np1", "npN", "npNslots")
