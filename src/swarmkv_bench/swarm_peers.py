"""llama.cpp's own llama-server as peers of `swarmkv bench --swarm`, on the same arrivals.

Each setup of peer_server.SETUPS gets a fresh server per rate, healthy before the replay
starts (start-up is outside every time): np1 (one slot and its prompt cache; the server
queues the requests and serves one at a time), npN (max_live slots sharing one KV buffer,
--kv-unified: continuous batching) and npNslots (max_live slots, a KV cache each). A client
sends every request at its arrival time through the same `replay` as the other systems, each
in its own thread, so a request the server holds in its queue never delays the next arrival.

The document: np1 first gets one request of the document alone (n_predict 1, excluded from
everything), so its slot's cache holds the document before the first arrival, as SwarmKV's
document is prefilled before it. npN and npNslots get none: each slot prefills the document
itself when it first serves a request (the server's prompt cache may let later requests reuse
it), which is how that peer really runs; the server's own counts of evaluated and cached prompt
tokens are reported beside it.

Per branch, as BranchResult, in milliseconds from the request going out (its arrival):
queue_ms to the response headers, which this server sends when a slot takes the request (it
starts on the prompt); activation_ms to the first streamed token; completion_ms to the last;
inter_token_ms between streamed tokens. tokens: the streamed ids less a closing
end-of-generation id (the server streams it, the host lock stops there without counting it).
A failed request keeps NaN times and stop_reason "error: ..."; the stats leave it out and
failed_branches counts it. Tokens are compared with the host lock's and a mismatch is
reported: the server is not batch invariant and tokenizes document + prompt as one string.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmkv.engine.result import BranchResult
from swarmkv.errors import ConfigError

from .modes import PEER_PREFIX, peer_setups
from .peer import ms_between, peer_totals
from .peer_client import BranchRun, PeerClient, attempt, completion_payload
from .peer_server import SETUPS, LlamaServer, ServerConfig, Setup, Tokenizer, log, size_n_ctx
from .runner import peer_timeout_s
from .swarm_arrivals import Arrival, SystemRun, replay
from .workload import BenchConfig

SYSTEM_PREFIX = PEER_PREFIX  # system names in the report: server-np1, server-npN, ...
BUILD_HINT = "build it with `bash bench/build_llama_server.sh` (or set $SWARMKV_LLAMA_SERVER)"
N_BATCH = 512  # the swarm's n_batch: the same batch shapes
STOP_REASONS = {"eos": "eog", "limit": "length"}  # the server's stop_type -> SwarmKV's words


def select_peers(spec: str | None, binary: Path | None) -> tuple[Setup, ...]:
    """--swarm's peers: without --peers every setup when llama-server is built and none (a
    warning says why) when not; setups asked for by name need the binary (ConfigError)."""
    if spec is None:
        if binary is None:
            log.warning("llama-server peers skipped: not built; %s", BUILD_HINT)
            return ()
        return SETUPS
    setups = peer_setups(spec)
    if setups and binary is None:
        raise ConfigError(f"--peers {spec}: llama-server not found; {BUILD_HINT}")
    return setups


@dataclass(frozen=True)
class PeerBench:
    """What every peer run shares: the server binary, the model file, threads, and the
    slots of npN and npNslots (the swarm's max_live)."""

    binary: Path
    model_path: Path
    threads: int
    max_live: int

    def config(self, setup: Setup, longest_prompt: int, n_predict: int) -> ServerConfig:
        """The server for setup, -c sized so that every slot holds its longest request;
        --swa-full like the swarm's contexts (and so the prompt cache reaches past the
        sliding window)."""
        n_parallel = 1 if setup == "np1" else self.max_live
        unified = setup == "npN"
        n_ctx = size_n_ctx(longest_prompt, n_predict, n_parallel, kv_unified=unified)
        return ServerConfig(
            self.model_path, n_ctx, n_parallel, self.threads, N_BATCH, unified, swa_full=True
        )


def run_peer(
    bench: PeerBench,
    setup: Setup,
    doc: str,
    arrivals: Sequence[Arrival],
    tokenizer: Tokenizer,
    prompt_tokens: Sequence[int],
) -> SystemRun:
    """The arrivals against a fresh llama-server in setup; prompt_tokens[i] is arrival i's
    prompt length as SwarmKV counts it (the same column for every system)."""
    lengths = [len(tokenizer.tokenize(doc + a.prompt)) for a in arrivals]
    n_max = max(a.n_predict for a in arrivals)
    config = bench.config(setup, max(lengths), n_max)
    timeout_s = peer_timeout_s(BenchConfig(len(arrivals), max(lengths), n_max))
    with LlamaServer(bench.binary, config) as server:
        run = replay_to_server(
            server.base_url, doc, arrivals, prompt_tokens, warm=setup == "np1", timeout_s=timeout_s
        )
        more = {
            "server_start_ms": server.start_ms,
            "n_ctx": config.n_ctx,
            "n_parallel": config.n_parallel,
            "peak_rss_bytes": server.peak_rss_bytes(),
        }
    return dataclasses.replace(run, extra=run.extra | more)


def replay_to_server(
    base_url: str,
    doc: str,
    arrivals: Sequence[Arrival],
    prompt_tokens: Sequence[int],
    *,
    warm: bool,
    timeout_s: float = 600.0,
) -> SystemRun:
    """Every arrival as one streamed /completion of document + prompt, sent at its time;
    with warm, the document alone first (see the module doc). Wall time runs from the
    first release to the last closing event."""
    client = PeerClient(base_url, timeout_s)
    extra: dict[str, Any] = warm_document(client, doc) if warm else {}
    runs = {a.index: BranchRun(a.index) for a in arrivals}
    payloads = {a.index: completion_payload(doc + a.prompt, a.n_predict) for a in arrivals}
    threads: list[threading.Thread] = []

    def release(a: Arrival) -> None:
        thread = threading.Thread(
            target=attempt, args=(client, payloads[a.index], runs[a.index]), name=a.name
        )
        thread.start()
        threads.append(thread)

    t0 = time.perf_counter()
    replay(arrivals, release)
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t0
    results = [
        branch_result(a, runs[a.index], n) for a, n in zip(arrivals, prompt_tokens, strict=True)
    ]
    return SystemRun(results, wall, extra | peer_totals(list(runs.values())))


def warm_document(client: PeerClient, doc: str) -> dict[str, Any]:
    """The document alone, n_predict 1, so np1's slot holds it before the first arrival.
    A failure raises: a server that cannot answer this cannot run the arrivals."""
    run = BranchRun(-1)
    client.stream_completion(completion_payload(doc, 1), run)
    return {
        "warmup_prompt_tokens_evaluated": run.timings.get("prompt_n", math.nan),
        "warmup_ms": ms_between(run.sent_ns, run.last_ns),
    }


def branch_result(a: Arrival, run: BranchRun, prompt_tokens: int) -> BranchResult:
    """The request's record, shaped like the swarm's (see the module doc)."""
    failed = run.error is not None or not run.stamps_ns
    tokens = run.tokens[:-1] if run.stop_type == "eos" and run.tokens else run.tokens
    stamps = [] if failed else run.stamps_ns
    reason = f"error: {run.error or 'no token streamed'}" if failed else run.stop_type or "none"
    return BranchResult(
        name=a.name,
        doc="doc",
        text=run.text,
        tokens=tuple(tokens),
        stop_reason=STOP_REASONS.get(reason, reason),
        priority=a.priority,  # the server has no priorities: kept to compare like with like
        prompt_tokens=prompt_tokens,
        arrival_s=a.t_s,
        queue_ms=math.nan if failed else ms_between(run.sent_ns, run.started_ns),
        activation_ms=ms_between(run.sent_ns, stamps[0]) if stamps else math.nan,
        completion_ms=ms_between(run.sent_ns, stamps[-1]) if stamps else math.nan,
        inter_token_ms=tuple((y - x) / 1e6 for x, y in itertools.pairwise(stamps)),
    )
