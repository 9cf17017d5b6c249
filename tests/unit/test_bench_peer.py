"""The llama-server peer without llama-server: SSE parsing, command lines, sizing, records, and
the whole client path against a fake server on 127.0.0.1 (fake_llama_server.py, in a thread
or as a fake binary: conftest's fixtures).
"""

from __future__ import annotations

import io
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from fake_llama_server import TOKEN_DELAY_S, FakeServer, fake_tokens

from swarmkv.errors import ConfigError
from swarmkv_bench import peer
from swarmkv_bench.peer import (
    BranchRun,
    LlamaServer,
    PeerClient,
    PeerServerError,
    ServerConfig,
    build_command,
    build_peer_record,
    completion_payload,
    find_llama_server,
    free_port,
    iter_sse_events,
    read_peak_rss,
    run_peer_trial,
    run_peer_trial_at,
    size_n_ctx,
)
from swarmkv_bench.peer_server import child_env

DOC = "The quick brown fox jumps over the lazy dog. " * 3
PROMPTS = [" Question one?", " Question two?", " Question three?"]
NAMES = ["b1", "b2", "b3"]


def _trial_at(server: FakeServer, setup: peer.Setup, prompts: list[str] = PROMPTS, **kw: Any):
    args: dict[str, Any] = dict(
        doc=DOC, prompts=prompts, n_predict=4, setup=setup, config_id="cfg", trial=0,
        is_warmup=False, baseline_tokens=None, branch_names=NAMES[: len(prompts)], doc_tokens=11,
    )  # fmt: skip
    return run_peer_trial_at(server.base_url, **(args | kw))


# ----------------------------------------------------------------------------- SSE parsing


def test_sse_parsing_of_a_canned_stream() -> None:
    stream = (
        b": ping\n\n"
        b'data: {"content": "a", "tokens": [5], "stop": false}\n\n'
        b"event: message\r\n"
        b'data: {"content": "b",\r\n'
        b'data:  "tokens": [6]}\r\n\r\n'
        b'data:{"stop": true, "timings": {"prompt_n": 3}}\n\n'
        b"data: [DONE]\n\n"
        b'data: {"never": "read"}\n\n'
    )
    events = list(iter_sse_events(io.BytesIO(stream).readline))
    assert events == [
        {"content": "a", "tokens": [5], "stop": False},
        {"content": "b", "tokens": [6]},
        {"stop": True, "timings": {"prompt_n": 3}},
    ]


def test_sse_last_event_without_blank_line_and_empty_stream() -> None:
    assert list(iter_sse_events(io.BytesIO(b'data: {"a": 1}').readline)) == [{"a": 1}]
    assert list(iter_sse_events(io.BytesIO(b"").readline)) == []


def test_completion_payload_is_greedy_streamed_and_cached() -> None:
    payload = completion_payload("doc prompt", 7)
    assert payload["prompt"] == "doc prompt"
    assert payload["n_predict"] == 7
    assert payload["samplers"] == ["top_k"] and payload["top_k"] == 1
    assert payload["cache_prompt"] is True and payload["stream"] is True
    assert payload["return_tokens"] is True


# ----------------------------------------------------------------------------- command line


def _cfg(**kw: Any) -> ServerConfig:
    base: dict[str, Any] = dict(model_path=Path("/m/model.gguf"), n_ctx=4096, threads=2)
    return ServerConfig(**(base | kw))


def _flag_value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_command_np1() -> None:
    options = frozenset({"--no-kv-unified", "--no-webui", "--cache-prompt"})
    cmd = build_command(Path("/bin/llama-server"), _cfg(n_batch=256), 8123, options)
    assert cmd[0] == "/bin/llama-server"
    assert _flag_value(cmd, "-m") == "/m/model.gguf"
    assert _flag_value(cmd, "--host") == "127.0.0.1"
    assert _flag_value(cmd, "--port") == "8123"
    assert _flag_value(cmd, "-c") == "4096"
    assert _flag_value(cmd, "-np") == "1"
    assert _flag_value(cmd, "-t") == _flag_value(cmd, "-tb") == "2"
    assert _flag_value(cmd, "-b") == _flag_value(cmd, "-ub") == "256"
    assert _flag_value(cmd, "-fa") == "auto"
    assert "--kv-unified" not in cmd and "--swa-full" not in cmd
    assert {"--no-kv-unified", "--no-webui", "--cache-prompt"} <= set(cmd)


def test_command_npn_unified_swa_full_flash() -> None:
    cfg = _cfg(n_parallel=4, kv_unified=True, swa_full=True, flash_attn="on")
    cmd = build_command(Path("srv"), cfg, 9000, frozenset({"--no-kv-unified"}))
    assert _flag_value(cmd, "-np") == "4"
    assert "--kv-unified" in cmd and "--no-kv-unified" not in cmd
    assert "--swa-full" in cmd
    assert _flag_value(cmd, "-fa") == "on"
    # Flags the binary's --help does not list are never passed.
    assert "--no-webui" not in cmd and "--cache-prompt" not in cmd


def test_server_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="flash_attn"):
        _cfg(flash_attn="yes")
    with pytest.raises(ValueError, match=">= 1"):
        _cfg(n_parallel=0)
    with pytest.raises(ValueError, match="need flash attention"):
        _cfg(batch_invariant=True, flash_attn="off")


def test_invariant_server_keeps_weights_as_stored_and_sets_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = frozenset({"--no-repack", "--no-webui"})
    assert "--no-repack" not in build_command(Path("srv"), _cfg(), 9000, options)
    cmd = build_command(Path("srv"), _cfg(batch_invariant=True), 9000, options)
    assert "--no-repack" in cmd
    with pytest.raises(PeerServerError, match="no --no-repack"):
        build_command(Path("srv"), _cfg(batch_invariant=True), 9000, frozenset({"--no-webui"}))
    # the variable is set exactly when asked: never inherited, never leaked from the caller
    monkeypatch.setenv("LLAMA_BATCH_INVARIANT", "1")
    monkeypatch.setenv("LLAMA_ARG_THREADS", "7")
    plain, inv = child_env(_cfg()), child_env(_cfg(batch_invariant=True))
    assert "LLAMA_BATCH_INVARIANT" not in plain and "LLAMA_ARG_THREADS" not in plain
    assert inv["LLAMA_BATCH_INVARIANT"] == "1" and "LLAMA_ARG_THREADS" not in inv
    assert plain["PATH"] == inv["PATH"] == os.environ["PATH"]


# ----------------------------------------------------------------------------- sizing, port


def test_size_n_ctx_np1_pads_to_256() -> None:
    assert size_n_ctx(3501, 32, 1) == 3584  # 3501 + 32 + 32 = 3565 -> 3584
    assert size_n_ctx(100, 4, 1, margin=0) == 256
    assert size_n_ctx(3501, 32, 1, kv_unified=True) == 3584


def test_size_n_ctx_split_and_unified() -> None:
    # Split: each slot gets n_ctx / N, padded to 256 by the server, so pad per slot.
    split = size_n_ctx(1000, 24, 3)
    assert split == 3 * 1280 and split // 3 >= 1000 + 24
    # Unified: the slots share one buffer holding all of them.
    unified = size_n_ctx(1000, 24, 3, kv_unified=True)
    assert unified == 3328 and unified >= 3 * (1000 + 24)
    with pytest.raises(ValueError):
        size_n_ctx(0, 4, 1)


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


# ----------------------------------------------------------------------------- records


def _run(i: int, sent: int, first: int, last: int, tokens: list[int], **timings: float):
    return BranchRun(i, sent, first, last, tokens, dict(timings))


MS = 1_000_000  # ns


def test_record_np1_from_canned_timings() -> None:
    runs = [
        _run(0, 10 * MS, 110 * MS, 150 * MS, [1, 2], prompt_n=300, cache_n=0, prompt_ms=95.0,
             predicted_ms=38.0, predicted_n=2),
        _run(1, 151 * MS, 171 * MS, 200 * MS, [3, 4], prompt_n=5, cache_n=298, prompt_ms=15.0,
             predicted_ms=27.0, predicted_n=2),
    ]  # fmt: skip
    rec = build_peer_record(
        runs, 0, setup="np1", config_id="c", trial=2, is_warmup=False, n_predict=2,
        doc_tokens=290, branch_names=["b1", "b2"], baseline_tokens={"b1": [1, 2], "b2": [3, 4]},
    )  # fmt: skip
    assert rec.mode == "server-np1"
    assert rec.e2e_ms == pytest.approx(200.0)
    assert rec.prefill_ms == pytest.approx(95.0)  # the first request's prompt_ms
    assert rec.activation_ms == pytest.approx((100.0, 20.0))  # from each request's send
    assert rec.first_token_ms == pytest.approx((110.0, 171.0))
    assert rec.end_ms == pytest.approx((150.0, 200.0))
    assert rec.decode_ms == pytest.approx((38.0, 27.0))
    assert rec.branch_prefill_ms == pytest.approx((95.0, 15.0))
    assert rec.tokens_generated == 4
    assert rec.fidelity_ok is True and "b2: 2 tokens equal" in rec.fidelity_detail
    assert rec.extra["prompt_tokens_evaluated_b0"] == 300
    assert rec.extra["prompt_tokens_evaluated_b1"] == 5
    assert rec.extra["prompt_tokens_evaluated"] == 305
    assert rec.extra["prompt_tokens_cached_b1"] == 298
    assert rec.extra["token_ids_withheld"] == 0
    assert (rec.doc_tokens, rec.n_branches, rec.trial) == (290, 2, 2)


def test_record_npn_activation_from_trial_start_and_mismatch_reported() -> None:
    runs = [
        _run(0, 1 * MS, 300 * MS, 400 * MS, [1, 2], prompt_n=300, prompt_ms=280.0, predicted_n=2),
        _run(1, 2 * MS, 310 * MS, 420 * MS, [3, 9], prompt_n=300, prompt_ms=290.0, predicted_n=2),
    ]
    rec = build_peer_record(
        runs, 0, setup="npN", config_id="c", trial=0, is_warmup=True, n_predict=2,
        doc_tokens=290, branch_names=["b1", "b2"], baseline_tokens={"b1": [1, 2], "b2": [3, 4]},
    )  # fmt: skip
    assert rec.mode == "server-npN" and rec.is_warmup
    assert rec.activation_ms == pytest.approx((300.0, 310.0))
    assert rec.prefill_ms == pytest.approx(290.0)  # overlapping prefills: the longest
    assert rec.branch_prefill_ms == ()
    assert rec.e2e_ms == pytest.approx(420.0)
    assert rec.fidelity_ok is False
    assert "b2: diverged at step 1 of 2 (got 9, baseline 4)" in rec.fidelity_detail


def test_record_withheld_ids_and_failed_request() -> None:
    withheld = _run(0, 0, 5 * MS, 9 * MS, [7], predicted_n=2, prompt_ms=1.0)
    failed = BranchRun(1, sent_ns=10 * MS, error="PeerRequestError: HTTP 500")
    rec = build_peer_record(
        [withheld, failed], 0, setup="np1", config_id="c", trial=0, is_warmup=False,
        n_predict=2, doc_tokens=3, branch_names=["b1", "b2"], baseline_tokens=None,
    )  # fmt: skip
    assert rec.fidelity_ok is False  # even without a baseline
    assert "stream carried 1 of 2 token ids" in rec.fidelity_detail
    assert "b2: request failed: PeerRequestError: HTTP 500" in rec.fidelity_detail
    assert math.isnan(rec.e2e_ms)
    assert math.isnan(rec.activation_ms[1]) and math.isnan(rec.end_ms[1])
    assert rec.extra["token_ids_withheld"] == 1 and rec.extra["failed_branches"] == 1
    assert rec.tokens_generated == 2


def test_record_without_baseline_is_not_checked() -> None:
    run = _run(0, 0, MS, 2 * MS, [1], predicted_n=1, prompt_ms=1.0)
    rec = build_peer_record(
        [run], 0, setup="np1", config_id="c", trial=0, is_warmup=False, n_predict=1,
        doc_tokens=3, branch_names=["b1"], baseline_tokens=None,
    )  # fmt: skip
    assert rec.fidelity_ok is None and rec.fidelity_detail.startswith("not checked")
    assert rec.to_dict()["mode"] == "server-np1"


# ----------------------------------------------------------------------------- client path


def test_client_health_and_stream(fake_server: FakeServer) -> None:
    client = PeerClient(fake_server.base_url, timeout_s=10)
    assert client.health()
    run = BranchRun(0)
    client.stream_completion(completion_payload(DOC + PROMPTS[0], 3), run)
    assert run.tokens == fake_tokens(DOC + PROMPTS[0], 3)
    assert run.sent_ns is not None and run.first_ns is not None and run.last_ns is not None
    assert run.sent_ns < run.first_ns < run.last_ns
    assert run.timings["predicted_n"] == 3 and run.error is None
    assert not PeerClient("http://127.0.0.1:1", timeout_s=1).health()
    with pytest.raises(ValueError):
        PeerClient("https://127.0.0.1")


def test_np1_trial_end_to_end_sequential(fake_server: FakeServer) -> None:
    baseline = {n: fake_tokens(DOC + p, 4) for n, p in zip(NAMES, PROMPTS, strict=True)}
    rec = _trial_at(fake_server, "np1", baseline_tokens=baseline)
    reqs = fake_server.requests
    assert [body["prompt"] for body, *_ in reqs] == [DOC + p for p in PROMPTS]
    assert all(reqs[i + 1][1] >= reqs[i][2] for i in range(len(reqs) - 1))  # one at a time
    assert all(body["samplers"] == ["top_k"] and body["cache_prompt"] for body, *_ in reqs)
    assert rec.mode == "server-np1" and rec.fidelity_ok is True
    assert rec.tokens_generated == 12 and rec.doc_tokens == 11
    # The fake's prompt cache keeps the document: later branches evaluate only their prompt.
    assert rec.extra["prompt_tokens_evaluated_b0"] == len(DOC + PROMPTS[0])
    assert rec.extra["prompt_tokens_evaluated_b1"] < len(PROMPTS[1])
    assert rec.prefill_ms == pytest.approx(12.5)
    assert 0 < rec.first_token_ms[0] < rec.end_ms[0] < rec.first_token_ms[1] < rec.e2e_ms
    assert all(a >= TOKEN_DELAY_S * 1000 * 0.9 for a in rec.activation_ms)
    assert rec.e2e_ms >= 3 * 4 * TOKEN_DELAY_S * 1000 * 0.9


def test_npn_trial_end_to_end_concurrent(fake_server: FakeServer) -> None:
    rec = _trial_at(fake_server, "npN")
    reqs = fake_server.requests
    assert len(reqs) == 3
    assert max(start for _, start, _ in reqs) < min(end for *_, end in reqs)  # all at once
    assert rec.mode == "server-npN" and rec.fidelity_ok is None
    assert rec.activation_ms == pytest.approx(rec.first_token_ms)
    assert rec.e2e_ms == pytest.approx(max(rec.end_ms))
    # Concurrent: far less than three sequential streams.
    assert rec.e2e_ms < 3 * 4 * TOKEN_DELAY_S * 1000


def test_failed_and_broken_requests_are_recorded(fake_server: FakeServer) -> None:
    rec = _trial_at(fake_server, "np1", prompts=[" fine", " FAIL here", " ERROR here"])
    assert rec.fidelity_ok is False and math.isnan(rec.e2e_ms)
    assert "b2: request failed: PeerRequestError: HTTP 500" in rec.fidelity_detail
    assert "b3: request failed: PeerRequestError: server error event" in rec.fidelity_detail
    assert math.isfinite(rec.end_ms[0]) and math.isnan(rec.first_token_ms[1])
    assert rec.extra["failed_branches"] == 2


def test_withheld_id_is_reported(fake_server: FakeServer) -> None:
    rec = _trial_at(fake_server, "np1", prompts=[" SPLIT"])
    assert rec.fidelity_ok is False
    assert "stream carried 3 of 4 token ids" in rec.fidelity_detail


def test_trial_rejects_mismatched_names(fake_server: FakeServer) -> None:
    with pytest.raises(ValueError, match="branch name"):
        _trial_at(fake_server, "np1", branch_names=["only-one"])
    with pytest.raises(ValueError, match="setup"):
        _trial_at(fake_server, "np4")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- binary, process


def test_find_llama_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(peer.ENV_SERVER, raising=False)
    assert find_llama_server(tmp_path) is None
    built = tmp_path / "build/llama-server/bin/llama-server"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    assert find_llama_server(tmp_path) is None  # not executable
    built.chmod(0o755)
    assert find_llama_server(tmp_path) == built
    other = tmp_path / "elsewhere"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv(peer.ENV_SERVER, str(other))
    assert find_llama_server(tmp_path) == other  # the environment wins
    monkeypatch.setenv(peer.ENV_SERVER, str(tmp_path / "missing"))
    assert find_llama_server(tmp_path) is None


def test_read_peak_rss() -> None:
    assert (read_peak_rss(os.getpid()) or 0) > 1 << 20
    assert read_peak_rss(2**22 + 12345) is None


def _wait_gone(pid: int) -> bool:
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            return True
        try:
            status = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            return True
        if status == "Z":
            return True
        time.sleep(0.05)
    return False


def test_llama_server_lifecycle_with_fake_binary(fake_binary: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    with LlamaServer(fake_binary, _cfg(), log_path=log_path) as server:
        pid = server.pid
        assert pid is not None and server.start_ms > 0
        assert server.base_url.startswith("http://127.0.0.1:")
        assert PeerClient(server.base_url).health()
        assert (server.peak_rss_bytes() or 0) > 0
    assert _wait_gone(pid)
    logged = log_path.read_text()
    assert "--host 127.0.0.1" in logged and "--no-webui" in logged and "-np 1" in logged


def test_llama_server_death_reports_log_tail(fake_binary: Path) -> None:
    server = LlamaServer(fake_binary, _cfg(extra_args=("--die",)))
    with pytest.raises(PeerServerError, match=r"status 3 during start-up(.|\n)*not a GGUF"):
        server.start()
    assert server.pid is None and server.log_path.exists()  # kept for the post-mortem
    server.log_path.unlink()


def test_llama_server_killed_when_it_ignores_sigterm(fake_binary: Path) -> None:
    cfg = _cfg(extra_args=("--ignore-term",))
    with LlamaServer(fake_binary, cfg, stop_timeout_s=0.5) as server:
        pid = server.pid
        log_path = server.log_path
    assert pid is not None and _wait_gone(pid)
    assert not log_path.exists()  # a clean run's temporary log is removed


def test_run_peer_trial_with_fake_binary(fake_binary: Path) -> None:
    rec = run_peer_trial(
        fake_binary, Path("/m/model.gguf"), doc=DOC, prompts=PROMPTS[:2], n_predict=3,
        threads=1, setup="npN", swa_full=True, flash_attn="off", n_batch=64, config_id="cfg",
        trial=1, is_warmup=False, baseline_tokens=None, branch_names=NAMES[:2], n_ctx=512,
        doc_tokens=11, timeout_s=30,
    )  # fmt: skip
    assert rec.mode == "server-npN" and rec.tokens_generated == 6
    assert rec.extra["server_start_ms"] > 0 and rec.extra["n_ctx"] == 512
    assert (rec.peak_rss_bytes or 0) > 0
    assert math.isfinite(rec.e2e_ms) and rec.e2e_ms < rec.extra["server_start_ms"] + 10_000


def test_per_slot_caches_run_n_slots_without_a_unified_buffer(
    fake_binary: Path, tmp_path: Path
) -> None:
    """npNslots: one slot per branch, each with its own KV cache (-c split over the slots)."""
    log_path = tmp_path / "server.log"
    rec = run_peer_trial(
        fake_binary, Path("/m/model.gguf"), doc=DOC, prompts=PROMPTS[:2], n_predict=3,
        threads=1, setup="npNslots", swa_full=True, flash_attn="off", n_batch=64,
        config_id="cfg", trial=1, is_warmup=False, baseline_tokens=None,
        branch_names=NAMES[:2], n_ctx=512, doc_tokens=11, timeout_s=30, log_path=log_path,
    )  # fmt: skip
    assert rec.mode == "server-npNslots" and rec.tokens_generated == 6
    args = log_path.read_text()
    assert "-np 2" in args and "--kv-unified" not in args.replace("--no-kv-unified", "")


def test_peer_timeout_grows_with_the_work() -> None:
    from swarmkv_bench.runner import peer_timeout_s
    from swarmkv_bench.workload import BenchConfig

    small, wide = (
        peer_timeout_s(BenchConfig(2, 3501, 32)),
        peer_timeout_s(BenchConfig(64, 3501, 32)),
    )
    assert small >= 600 and wide > small + 2000  # 64 slots each prefilling 3501 tokens


def test_peer_names_are_parsed_from_one_list() -> None:
    from swarmkv_bench.modes import PEERS, peer_setup

    assert PEERS == (
        "server-np1",
        "server-npN",
        "server-npNslots",
        "server-np1+swa_window",
        "server-npN+swa_window",
        "server-npNslots+swa_window",
        "server-np1+inv",
        "server-npN+inv",
        "server-npNslots+inv",
    )
    assert peer_setup("server-npN") == ("npN", True, False)
    assert peer_setup("server-npNslots") == ("npNslots", True, False)
    assert peer_setup("server-np1+swa_window") == ("np1", False, False)
    assert peer_setup("server-npN+inv") == ("npN", True, True)
    assert peer_setup("server-npN").reference == "baseline"
    assert peer_setup("server-npN+inv").reference == "baseline+inv"
    with pytest.raises(ConfigError, match="unknown peer"):
        peer_setup("server-np2")


def test_sizing_without_a_tokenizer_is_a_clear_error(fake_binary: Path) -> None:
    with pytest.raises(ConfigError, match="or a tokenizer"):
        run_peer_trial(
            fake_binary, Path("/m/model.gguf"), doc=DOC, prompts=PROMPTS[:2], n_predict=3,
            threads=1, setup="npN", swa_full=True, flash_attn="off", n_batch=64, config_id="c",
            trial=1, is_warmup=False, baseline_tokens=None, branch_names=NAMES[:2],
        )  # fmt: skip
