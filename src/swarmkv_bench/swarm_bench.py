"""`swarmkv bench --swarm`: agents arriving as a Poisson process, served by the swarm
scheduler under each policy, by `host` mode's global lock (the paper's design) and by
llama.cpp's llama-server in each setup asked for (swarm_peers.py).

Every system gets the same arrivals (seeded): distinct prompts, n_predict drawn uniformly
from [n_min, n_max], priorities 0-2. The document is prefilled before the first arrival (not
in the latencies) in every system but llama-server's npN and npNslots, whose slots prefill it
themselves. The host lock decodes one branch at a time in arrival
order (restore the snapshot, prompt, generation), which makes each branch's service time
there its time alone: the slowdown whose fairness (Jain's index) is reported is completion
time over that, for every system.
"""

from __future__ import annotations

import json
import math
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmkv import Context, ContextConfig, HostBufferPool, Model, capture, restore
from swarmkv.engine.result import BranchResult, result_of
from swarmkv.engine.sequence import chunk_bounds
from swarmkv.engine.single import decode_branch, prefill
from swarmkv.engine.work import Request
from swarmkv.llama.config import default_threads
from swarmkv.llama.sampling import SamplerConfig
from swarmkv.process.threads import Worker, wait_all
from swarmkv.swarm import Swarm, SwarmStats

from .modes import PEER_PREFIX
from .peer_server import Setup
from .provenance import provenance
from .swarm_arrivals import Arrival, SystemRun, poisson_arrivals, replay
from .workload import document


def run_swarm(
    model: Model, doc: str, arrivals: Sequence[Arrival], policy: str, opts: dict[str, Any]
) -> SystemRun:
    """The arrivals against a Swarm under policy; (results in arrival order, wall seconds)."""
    with Swarm(model, policy=policy, **opts) as sw:
        sw.add_document("doc", text=doc)
        handles: list[Any] = []
        t0 = time.perf_counter()
        replay(
            arrivals,
            lambda a: handles.append(
                sw.submit("doc", a.prompt, n_predict=a.n_predict, priority=a.priority, name=a.name)
            ),
        )
        results = [h.result() for h in handles]
        return SystemRun(results, time.perf_counter() - t0)


def run_host_lock(
    model: Model, doc: str, arrivals: Sequence[Arrival], threads: int | None
) -> SystemRun:
    """The paper's design: one snapshot, one branch decoded at a time behind a global lock
    (the library's engine on one sequence, as host mode decodes a branch)."""
    tokens = model.tokenize(doc, add_special=True)
    n_ctx = len(tokens) + 256 + max(a.n_predict for a in arrivals)
    config = ContextConfig(n_ctx=n_ctx, n_batch=512, n_threads=threads, batch_invariant=True)
    todo: queue.SimpleQueue[tuple[Arrival, int] | None] = queue.SimpleQueue()
    results: dict[int, BranchResult] = {}
    with HostBufferPool() as pool, Context(model, config) as ctx:
        prefill(ctx, tokens, chunk_bounds(len(tokens), config.n_batch))
        with capture(ctx, 0, pool, tuple(tokens)) as snap:
            worker = Worker("host-lock", lambda: _lock_worker(ctx, snap, todo, results))
            t0 = time.perf_counter()
            try:
                replay(arrivals, lambda a: todo.put((a, time.perf_counter_ns())))
            finally:
                todo.put(None)
                wait_all([worker])
            wall = time.perf_counter() - t0
    return SystemRun([results[a.index] for a in arrivals], wall)


def _lock_worker(ctx: Context, snap: Any, todo: Any, results: dict[int, BranchResult]) -> None:
    while (item := todo.get()) is not None:
        a, arrival_ns = item
        results[a.index] = _serve_alone(ctx, snap, a, arrival_ns)


def _serve_alone(ctx: Context, snap: Any, a: Arrival, arrival_ns: int) -> BranchResult:
    restore(ctx, 0, snap)
    prompt = ctx.model.tokenize(a.prompt, add_special=False)
    req = Request(
        a.name,
        prompt,
        a.n_predict,
        SamplerConfig(),
        snap.n_tokens,
        seq_id=0,
        priority=a.priority,
        arrival_s=a.t_s,
        arrival_ns=arrival_ns,
    )
    decode_branch(ctx, req)  # frees seq 0 when the branch ends
    return result_of(req, ready_ns=arrival_ns, t0_ns=arrival_ns, doc="doc")


@dataclass
class SwarmBenchOptions:
    """What `swarmkv bench --swarm` runs; peers: the llama-server setups (peer_bin needed)."""

    model_path: Path
    rates: tuple[float, ...]
    agents: int
    n_min: int
    n_max: int
    seed: int
    policies: tuple[str, ...]
    max_live: int
    doc_tokens: int
    threads: int | None
    out_dir: Path
    command: str
    peers: tuple[Setup, ...] = ()
    peer_bin: Path | None = None


def run_swarm_bench(opts: SwarmBenchOptions) -> dict[str, Any]:
    """Every rate: the host lock first (its service times are the slowdown basis), then the
    swarm under each policy, then each llama-server peer; returns the JSON-ready report and
    writes it with the plots."""
    out: dict[str, Any] = {
        "command": opts.command,
        "provenance": provenance(opts.command, opts.model_path),
        "options": _opts_dict(opts),
        "rates": [],
    }
    with Model(opts.model_path, repack=False) as model:
        doc = document(model, opts.doc_tokens)
        n_ctx = opts.doc_tokens + opts.max_live * (64 + opts.n_max) + 512
        sw_opts = {
            "n_ctx": n_ctx,
            "max_live": opts.max_live,
            "max_docs": 1,
            "n_threads": opts.threads,
        }
        for rate in opts.rates:
            arrivals = poisson_arrivals(rate, opts.agents, opts.n_min, opts.n_max, opts.seed)
            systems = {"host-lock": run_host_lock(model, doc, arrivals, opts.threads)}
            for policy in opts.policies:
                systems[f"swarm-{policy}"] = run_swarm(model, doc, arrivals, policy, sw_opts)
            systems |= _run_peers(opts, model, doc, arrivals, systems["host-lock"])
            out["rates"].append(rate_entry(rate, systems))
    write_swarm_outputs(out, opts.out_dir)
    return out


def _run_peers(
    opts: SwarmBenchOptions, model: Model, doc: str, arrivals: Sequence[Arrival], host: SystemRun
) -> dict[str, SystemRun]:
    if not opts.peers:
        return {}
    from .swarm_peers import SYSTEM_PREFIX, PeerBench, run_peer

    if opts.peer_bin is None:
        raise ValueError("SwarmBenchOptions.peers needs peer_bin")
    bench = PeerBench(opts.peer_bin, opts.model_path, opts.threads or default_threads(),
                      opts.max_live)  # fmt: skip
    prompt_tokens = [r.prompt_tokens for r in host.results]
    return {
        SYSTEM_PREFIX + setup: run_peer(bench, setup, doc, arrivals, model, prompt_tokens)
        for setup in opts.peers
    }


def rate_entry(rate: float, systems: dict[str, SystemRun]) -> dict[str, Any]:
    """One rate of the report: every system's stats and branches, its tokens against the host
    lock's, and its own extras. The slowdown basis is each branch's service time under the
    host lock (its time alone). Stats cover the branches that finished (a peer's failed
    request has NaN times): failed_branches counts the rest."""
    host = systems["host-lock"].results
    alone = {r.name: max(r.completion_ms - r.queue_ms, 1e-3) for r in host}
    ref = {r.name: r.tokens for r in host}
    entry: dict[str, Any] = {"rate": rate, "systems": {}}
    for name, run in systems.items():
        done = [r for r in run.results if math.isfinite(r.completion_ms)]
        generated = sum(len(r.tokens) for r in done) + int(run.extra.get("token_ids_withheld", 0))
        stats = SwarmStats.of(done, generated, run.wall_s, alone_ms=lambda r: alone[r.name])
        same = [r.tokens == ref[r.name] for r in run.results]
        entry["systems"][name] = {
            **stats.to_dict(),
            **run.extra,
            "tokens_identical_to_host_lock": all(same),
            "tokens_identical_fraction": sum(same) / len(same) if same else math.nan,
            "failed_branches": len(run.results) - len(done),
            "branches": [r.to_dict() for r in run.results],
        }
    return entry


def _opts_dict(opts: SwarmBenchOptions) -> dict[str, Any]:
    return {
        "model": str(opts.model_path),
        "rates": list(opts.rates),
        "agents": opts.agents,
        "n_predict": [opts.n_min, opts.n_max],
        "seed": opts.seed,
        "policies": list(opts.policies),
        "max_live": opts.max_live,
        "doc_tokens": opts.doc_tokens,
        "threads": opts.threads,
        "peers": [PEER_PREFIX + p for p in opts.peers],
    }


def write_swarm_outputs(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """swarm.json, swarm.csv (one row per branch and system), swarm_report.md, plots."""
    from .swarm_plots import write_plots
    from .swarm_report import write_csv, write_markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "swarm.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return [
        path,
        write_csv(report, out_dir),
        write_markdown(report, out_dir),
        *write_plots(report, out_dir),
    ]
