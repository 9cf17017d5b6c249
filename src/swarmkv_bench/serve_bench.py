"""`swarmkv bench --serve`: agents through the official `openai` async client against
`swarmkv serve` and llama-server peers, on every workload (serve_workloads), at every rate,
for every seed, in each kernel family (serve_systems).

Each run is a fresh server: warmed with the workload's heads (max_tokens 1) before the clock
starts, then the agents at their seeded Poisson arrivals (serve_load), then every prompt the
run sent, again, alone: the answer it gets alone (must be the same text on an exact system)
and its time alone (the basis of slowdown and queue time). Its figures are serve_stats'.
The order of the systems rotates from seed to seed.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .cpu_split import measured
from .peer_server import find_llama_server
from .probe_words import PROBE_WORDS
from .serve_load import replica_split, run_alone, run_load, warm, warm_every_engine
from .serve_stats import add_utilization, run_stats, summarize
from .serve_systems import (
    KERNELS,
    PEERS,
    RAY_SYSTEM,
    RESTORED,
    SWARMKV_SYSTEMS,
    Setup,
    binary_info,
    describe,
    open_system,
    peak_rss,
    sizes,
    warm_copies,
)
from .serve_targets import targets
from .serve_workloads import WORKLOADS, Shapes, Workload, arrival_times, build
from .slot_restore import slot_dir_of, warm_by_restore

log = logging.getLogger("swarmkv.bench")


@dataclass(frozen=True)
class ServeBenchOptions:
    """What `swarmkv bench --serve` runs."""

    model: Path
    head: str  # the shared head's text (the overhead probe's too)
    head_tokens: int
    shapes: Shapes = field(default_factory=Shapes)
    workloads: tuple[str, ...] = WORKLOADS
    rates: tuple[float, ...] = (2.0,)
    threads: int = 2
    seeds: tuple[int, ...] = (0, 1, 2)
    peers: tuple[str, ...] = tuple(PEERS)
    kernels: tuple[str, ...] = ("exact",)
    llama_server: Path | None = None
    probes: int = len(PROBE_WORDS) - 1  # the overhead probe's, after its warm-up
    overhead: bool = True
    ray: bool = False  # swarmkv-ray2 too: two Ray Serve replicas on the same cores


def setup_record(opts: ServeBenchOptions) -> dict[str, Any]:
    """The options a result records (the head's text aside: its length is there)."""
    out = {k: v for k, v in asdict(opts).items() if k != "head"}
    out["rates"] = [rate_label(r) for r in opts.rates]
    return out


def one_run(
    name: str, setup: Setup, work: Workload, size: Any, rate: float, seed: int
) -> dict[str, Any]:
    """One system, fresh and warmed, under the workload at one rate and seed."""
    arrivals = arrival_times(len(work.agents), rate, seed)  # rate inf: a burst
    with open_system(name, setup, work, size) as server:
        v1 = server.base_url + "/v1"
        if name in SWARMKV_SYSTEMS:
            asyncio.run(warm_every_engine(v1, work.heads))
        elif name in RESTORED and work.heads:
            slot_dir = slot_dir_of(server.config.extra_args)
            warm_by_restore(server.base_url, work.heads, PEERS[name][0], slot_dir)
        else:
            asyncio.run(warm(v1, work.heads, warm_copies(name, work)))
        with measured() as cpu:
            reqs, wall = asyncio.run(run_load(v1, work, arrivals))
        warmed = max(1, len(work.heads))  # warm-ups each replica finished
        split = asyncio.run(replica_split(v1, warmed, len(reqs))) if name == RAY_SYSTEM else None
        alone = asyncio.run(run_alone(v1, [r.prompt for r in reqs], work.n_predict))
        rss = peak_rss(server)
        command = describe(name, setup, server)
    run = {
        "workload": work.name,
        "rate": rate_label(rate),
        "seed": seed,
        "system": name,
        "kernels": setup.kernels,
        **run_stats(reqs, alone, wall, work, rate),
        "peak_rss_bytes": rss,
        "cpu_s": cpu.seconds,
        **({"requests_per_replica": split} if split is not None else {}),
        "command": command,
        "requests_log": [r.record() for r in reqs],
    }
    log.info(
        "%s %s/%s rate %g seed %d: %s",
        work.name,
        name,
        setup.kernels,
        rate,
        seed,
        {k: run[k] for k in ("tokens_per_s", "ttft_ms", "errors", "identical_to_alone")},
    )
    return run


def rate_label(rate: float) -> float | str:
    """A rate as the result file writes it: a burst (inf, which JSON lacks) is "burst"."""
    return rate if math.isfinite(rate) else "burst"


def rotated(names: Sequence[str], k: int) -> list[str]:
    """names rotated left by k: each seed starts with another system."""
    k %= max(1, len(names))
    return [*names[k:], *names[:k]]


def run_workload(opts: ServeBenchOptions, work: Workload, model: Any) -> dict[str, Any]:
    """Every rate × seed × kernels × system on one workload; per rate, the summary."""
    size = sizes(work, model)
    systems = ["swarmkv", *([RAY_SYSTEM] if opts.ray else [])]
    systems += list(opts.peers if opts.llama_server else ())
    runs = []
    for rate in opts.rates:
        # a burst runs at every seed too: the seed moves no arrival there, but the order in
        # which a server's queue takes the simultaneous requests differs from run to run, and
        # with it what a server computes (bench/restore_burst.py: the saved-slots peer's
        # burst recomputed 0 to 8 heads over 4 runs of one binary)
        for k, seed in enumerate(opts.seeds):
            for kernels in opts.kernels:
                setup = Setup(opts.model, opts.threads, kernels, opts.llama_server)
                runs += [one_run(n, setup, work, size, rate, seed) for n in rotated(systems, k)]
    add_utilization(runs)
    by_rate = [
        {"rate": rate, "summary": summarize([r for r in runs if r["rate"] == rate])}
        for rate in map(rate_label, opts.rates)
    ]
    return {
        "agents": len(work.agents),
        "requests": work.requests,
        "heads": len(work.heads),
        "n_predict": work.n_predict,
        "sizes": asdict(size),
        "by_rate": by_rate,
        "runs": runs,
    }


def run_serve_bench(opts: ServeBenchOptions, model: Any) -> dict[str, Any]:
    """Every workload, then the HTTP overhead probe; the targets over all of it."""
    shapes = opts.shapes
    out: dict[str, Any] = {"setup": setup_record(opts), "workloads": {}}
    for name in opts.workloads:
        work = build(name, model, shapes)
        out["workloads"][name] = run_workload(opts, work, model)
    out["targets"] = targets(out["workloads"], opts.kernels)
    if opts.llama_server is not None and opts.peers:
        out["peer_binary"] = binary_info(opts.llama_server)
    if opts.overhead:
        from .serve_overhead import overhead

        out["http_overhead"] = overhead(opts)
    return out


def default_llama_server() -> Path | None:
    """The llama-server the bench finds ($SWARMKV_LLAMA_SERVER or the repository's build)."""
    return find_llama_server()


__all__ = ["KERNELS", "ServeBenchOptions", "default_llama_server", "run_serve_bench"]
