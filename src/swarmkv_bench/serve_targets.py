"""The serving issue's targets, from `swarmkv bench --serve`'s runs, per kernel family.

- shared, at the operating rate (the one whose median SwarmKV load is 8-16 requests in
  flight, else the nearest to 12): the best peer's p99 time to first token over SwarmKV's
  >= 5x, SwarmKV's tokens/s over the best peer's >= 1.5x; the same ratios at the lowest rate
  where every system keeps up (utilization <= 1 in every seed), reported as they are;
- multiturn, at every rate: SwarmKV's prompt tokens computed over server-np16's <= 1/5;
- with swarmkv-ray2 (bench --serve --ray), on every workload and rate: its tokens/s over one
  `swarmkv serve`'s on the same cores >= 0.9, and (batch-invariant kernels: plain ones depend
  on the batch and on the replicas' thread count) its answers the same as that server's.
Each value is one seed's; a target passes when its worst seed does. Peers are the llama-server
setups only: SwarmKV's own systems never count as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .metrics import spread
from .serve_systems import RAY_SYSTEM

LIVE_RANGE = (8.0, 16.0)


def _by(runs: Sequence[dict[str, Any]], rate: float, kernels: str) -> dict[int, dict[str, Any]]:
    """seed -> system -> run, at one rate and kernel family."""
    out: dict[int, dict[str, Any]] = {}
    for r in runs:
        if r["rate"] == rate and r["kernels"] == kernels:
            out.setdefault(r["seed"], {})[r["system"]] = r
    return out


def operating_rate(work: dict[str, Any], kernels: str) -> float | None:
    """The rate whose median SwarmKV requests-in-flight is within LIVE_RANGE, else nearest
    to its middle."""
    loads = []
    for entry in work["by_rate"]:
        if entry["rate"] == "burst":  # everything at once: no arrival rate to operate at
            continue
        row = entry["summary"].get(f"swarmkv/{kernels}")
        if row and row["in_flight_mean"]:
            loads.append((entry["rate"], row["in_flight_mean"][0]))
    inside = [(rate, load) for rate, load in loads if LIVE_RANGE[0] <= load <= LIVE_RANGE[1]]
    mid = sum(LIVE_RANGE) / 2
    pick = min(inside or loads, key=lambda x: abs(x[1] - mid), default=None)
    return pick[0] if pick else None


def keeps_up_rate(work: dict[str, Any], kernels: str) -> float | None:
    """The lowest rate at which every system of the family has utilization <= 1 in every
    seed (None when there is none, or no capacity could be measured)."""
    for rate in sorted(e["rate"] for e in work["by_rate"] if e["rate"] != "burst"):
        rows = [r for r in work["runs"] if r["rate"] == rate and r["kernels"] == kernels]
        if rows and all(r["utilization"] is not None and r["utilization"] <= 1 for r in rows):
            return rate
    return None


def _target(
    name: str, values: list[float], goal: float, higher: bool, **extra: Any
) -> dict[str, Any]:
    worst = (min if higher else max)(values) if values else None
    ok = None if worst is None else (worst >= goal if higher else worst <= goal)
    return {
        "target": name,
        "goal": f"{'>=' if higher else '<='} {goal:g}",
        "per_seed": values,
        "spread": spread(values) if values else None,
        "pass": ok,
        **extra,
    }


def shared_ratios(
    work: dict[str, Any], rate: float, kernels: str
) -> tuple[list[float], list[float]]:
    """Per seed: best peer p99 TTFT / SwarmKV's, SwarmKV tokens/s / the best peer's."""
    ttft, tps = [], []
    for systems in _by(work["runs"], rate, kernels).values():
        mine = systems.get("swarmkv")
        peers = [r for n, r in systems.items() if not n.startswith("swarmkv")]
        if mine is None or not peers or mine["ttft_ms"]["p99"] is None:
            continue
        p99s = [p["ttft_ms"]["p99"] for p in peers if p["ttft_ms"]["p99"] is not None]
        rates = [p["tokens_per_s"] for p in peers if p["tokens_per_s"]]
        if p99s and rates and mine["tokens_per_s"]:
            ttft.append(min(p99s) / mine["ttft_ms"]["p99"])
            tps.append(mine["tokens_per_s"] / max(rates))
    return ttft, tps


def _shared(work: dict[str, Any], kernels: str) -> list[dict[str, Any]]:
    out = []
    for label, rate in (
        ("operating", operating_rate(work, kernels)),
        ("keeps-up", keeps_up_rate(work, kernels)),
    ):
        if rate is None:
            continue
        ttft, tps = shared_ratios(work, rate, kernels)
        common = {"workload": "shared", "kernels": kernels, "rate": rate, "at": label}
        out.append(_target("p99 TTFT, best peer over swarmkv", ttft, 5, True, **common))
        out.append(_target("tokens/s, swarmkv over best peer", tps, 1.5, True, **common))
    return out


def _multiturn(work: dict[str, Any], kernels: str) -> list[dict[str, Any]]:
    out = []
    for entry in work["by_rate"]:
        values = []
        for systems in _by(work["runs"], entry["rate"], kernels).values():
            mine, peer = systems.get("swarmkv"), systems.get("server-np16")
            if mine is None or peer is None or mine["prompt_tokens_computed"] is None:
                continue
            if peer["prompt_tokens_computed"]:
                values.append(mine["prompt_tokens_computed"] / peer["prompt_tokens_computed"])
        if values:
            out.append(
                _target(
                    "prompt tokens computed, swarmkv over server-np16",
                    values,
                    0.2,
                    False,
                    workload="multiturn",
                    kernels=kernels,
                    rate=entry["rate"],
                    at="every rate",
                )
            )
    return out


def same_answers(mine: dict[str, Any], other: dict[str, Any]) -> int:
    """How many requests (agent and turn) got the same text from both runs."""
    texts = {(r["agent"], r["turn"]): r["text"] for r in mine["requests_log"] if not r["error"]}
    return sum(
        texts.get((r["agent"], r["turn"])) == r["text"]
        for r in other["requests_log"]
        if not r["error"]
    )


def _ray(name: str, work: dict[str, Any], kernels: str) -> list[dict[str, Any]]:
    out = []
    for entry in work["by_rate"]:
        ratios, same = [], []
        for systems in _by(work["runs"], entry["rate"], kernels).values():
            mine, ray = systems.get("swarmkv"), systems.get(RAY_SYSTEM)
            if mine is None or ray is None or not mine["tokens_per_s"]:
                continue
            ratios.append((ray["tokens_per_s"] or 0.0) / mine["tokens_per_s"])
            same.append(same_answers(mine, ray) / max(1, len(mine["requests_log"])))
        if ratios:
            common = {"workload": name, "kernels": kernels, "rate": entry["rate"]}
            out.append(
                _target(
                    f"tokens/s, {RAY_SYSTEM} over swarmkv",
                    ratios,
                    0.9,
                    True,
                    at="every rate",
                    **common,
                )
            )
            if kernels == "exact":  # plain answers depend on the batch and the threads
                out.append(
                    _target(
                        f"answers of {RAY_SYSTEM} equal to swarmkv's",
                        same,
                        1.0,
                        True,
                        at="every rate",
                        **common,
                    )
                )
    return out


def targets(workloads: dict[str, Any], kernels: Sequence[str]) -> list[dict[str, Any]]:
    """Every target the runs can judge (a workload or peer not run judges nothing)."""
    out: list[dict[str, Any]] = []
    for k in kernels:
        if "shared" in workloads:
            out += _shared(workloads["shared"], k)
        if "multiturn" in workloads:
            out += _multiturn(workloads["multiturn"], k)
        for name, work in workloads.items():
            out += _ray(name, work, k)
    return out
