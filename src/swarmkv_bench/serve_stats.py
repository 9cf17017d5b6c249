"""What one run of a workload on one system comes to (`run_stats`), and the same over seeds
(`summarize`): latency percentiles, throughput against the offered load, fairness, prompt
tokens computed and reused, answers against the same requests sent alone. Pure: no server."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from swarmkv.swarm.metrics import jain, percentile

from .metrics import spread
from .serve_load import Request
from .serve_workloads import Workload

QS = (50, 95, 99)


def _pcts(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": (percentile(values, q) if values else None) for q in QS}


def offered_tokens_per_s(work: Workload, rate: float) -> float | None:
    """Tokens/s the arrivals ask for: agents/s × turns per agent × max_tokens (None for a
    burst: everything at once asks for no rate)."""
    if math.isinf(rate):
        return None
    return rate * work.requests / len(work.agents) * work.n_predict


def in_flight(reqs: Sequence[Request]) -> dict[str, float]:
    """Requests in flight (sent, last token not yet received) on the client's clock: the
    time-weighted mean from the first send to the last answer, and the most at once."""
    events = sorted(
        e
        for r in reqs
        if r.done_ms is not None
        for e in ((r.sent_s, 1), (r.sent_s + r.done_ms / 1e3, -1))
    )
    if not events:
        return {"mean": 0.0, "max": 0.0}
    area, now, depth, most = 0.0, events[0][0], 0, 0
    for t, step in events:
        area += depth * (t - now)
        now, depth = t, depth + step
        most = max(most, depth)
    span = events[-1][0] - events[0][0]
    return {"mean": area / span if span > 0 else float(most), "max": float(most)}


def run_stats(
    reqs: Sequence[Request], alone: Sequence[Request], wall_s: float, work: Workload, rate: float
) -> dict[str, Any]:
    """One run's figures; alone[i] is reqs[i]'s prompt sent again by itself."""
    pairs = [(r, a) for r, a in zip(reqs, alone, strict=True) if r.error is None and r.ttft_ms]
    ok = [r for r, _ in pairs]
    tokens = sum(r.completion_tokens for r in ok)
    slowdown = [r.done_ms / a.done_ms for r, a in pairs if r.done_ms and a.done_ms]
    queue = [r.ttft_ms - a.ttft_ms for r, a in pairs if r.ttft_ms and a.ttft_ms]
    counted = [r for r in ok if r.prompt_tokens is not None and r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens or 0 for r in counted)
    reused = sum(r.cached_tokens or 0 for r in counted)
    return {
        "requests": len(reqs),
        "errors": len(reqs) - len(ok) + (work.requests - len(reqs)),
        "ttft_ms": _pcts([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "itl_ms": _pcts([g for r in ok for g in r.gaps_ms]),
        "done_ms": _pcts([r.done_ms for r in ok if r.done_ms is not None]),
        "queue_ms": _pcts(queue),
        "tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "offered_tokens_per_s": offered_tokens_per_s(work, rate),
        "jain_slowdown": jain(slowdown) if slowdown else None,
        "slowdown": _pcts(slowdown),
        # a server that does not report cached_tokens has its prompt tokens unsplit (None)
        "prompt_tokens": prompt if counted else None,
        "prompt_tokens_reused": reused if counted else None,
        "prompt_tokens_computed": prompt - reused if counted else None,
        "identical_to_alone": sum(r.text == a.text for r, a in pairs),
        "compared": len(pairs),
        "in_flight": in_flight(reqs),
    }


KEYS = {
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_p95_ms": ("ttft_ms", "p95"),
    "ttft_p99_ms": ("ttft_ms", "p99"),
    "itl_p50_ms": ("itl_ms", "p50"),
    "itl_p99_ms": ("itl_ms", "p99"),
    "done_p99_ms": ("done_ms", "p99"),
    "queue_p99_ms": ("queue_ms", "p99"),
}
FLAT = (
    "tokens_per_s",
    "jain_slowdown",
    "prompt_tokens_computed",
    "prompt_tokens_reused",
    "peak_rss_bytes",
    "utilization",
)


def _value(run: dict[str, Any], key: str) -> float | None:
    if key in KEYS:
        outer, inner = KEYS[key]
        v = run[outer][inner]
    elif key == "in_flight_mean":
        v = run["in_flight"]["mean"]
    else:
        v = run.get(key)
    return None if v is None else float(v)


def cpu_per_token(runs: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Per process group (cpu_split.py), CPU ms per generated token: [median, min, max] over
    the runs that measured it."""
    groups = sorted({g for r in runs for g in r.get("cpu_s", {})})
    out = {}
    for g in groups:
        vals = [
            r["cpu_s"][g] * 1e3 / r["tokens"]
            for r in runs
            if g in r.get("cpu_s", {}) and r["tokens"]
        ]
        if vals:
            out[g] = spread(vals)
    return out


def add_utilization(runs: Sequence[dict[str, Any]]) -> None:
    """Each run's utilization: its offered tokens/s over the system's capacity, the most
    tokens/s that system reached on this workload at any rate and seed (a burst's, where
    one was run: its best run is every seed's capacity, since a seed moves only arrival
    times). Over 1 the system is past capacity, and its latency is the burst's, not its
    scheduler's."""
    best: dict[tuple[str, str], float] = {}
    for r in runs:
        key = (r["system"], r["kernels"])
        best[key] = max(best.get(key, 0.0), r["tokens_per_s"] or 0.0)
    for r in runs:
        cap = best[(r["system"], r["kernels"])]
        offered = r["offered_tokens_per_s"]
        r["capacity_tokens_per_s"] = cap or None
        r["utilization"] = offered / cap if offered is not None and cap else None
        r["past_capacity"] = None if r["utilization"] is None else r["utilization"] > 1


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per (system, kernels): each figure's [median, min, max] over the seeds, errors and
    answers as alone summed."""
    out: dict[str, Any] = {}
    for r in runs:
        out.setdefault(f"{r['system']}/{r['kernels']}", []).append(r)
    summary = {}
    for name, rs in out.items():
        row: dict[str, Any] = {"seeds": [r["seed"] for r in rs]}
        for key in (*KEYS, *FLAT, "in_flight_mean"):
            vals = [v for r in rs if (v := _value(r, key)) is not None and math.isfinite(v)]
            row[key] = spread(vals) if vals else None
        row["errors"] = sum(r["errors"] for r in rs)
        row["identical_to_alone"] = f"{sum(r['identical_to_alone'] for r in rs)}/" + str(
            sum(r["compared"] for r in rs)
        )
        row["past_capacity"] = [r["past_capacity"] for r in rs]
        row["cpu_ms_per_token"] = cpu_per_token(rs)
        summary[name] = row
    return summary
