"""The outputs of `swarmkv bench --swarm`: CSV, a Markdown report, latency CDF plots and
tokens/s and p99 activation against the arrival rate; every system (swarm policies, the host
lock, llama-server peers) appears in each of them."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from .provenance import summary_lines

TARGETS = (
    ("p99 activation: host-lock / swarm-fair", ">=", 5.0),
    ("tokens/s: swarm-fair / host-lock", ">=", 1.5),
    ("Jain's index of slowdown, swarm-fair", ">=", 0.9),
    ("tokens/s: swarm-fair / server-np1", ">=", 1.5),
)
System = dict[str, Any]


def write_csv(report: dict[str, Any], out_dir: Path) -> Path:
    """swarm.csv: one row per rate, system and branch; same_as_host_lock compares token ids."""
    path = out_dir / "swarm.csv"
    cols = ["rate", "system", "name", "priority", "prompt_tokens", "n_tokens", "stop_reason",
            "same_as_host_lock", "arrival_s", "queue_ms", "activation_ms",
            "completion_ms"]  # fmt: skip
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for entry in report["rates"]:
            ref = {b["name"]: b["tokens"] for b in entry["systems"]["host-lock"]["branches"]}
            for system, s in entry["systems"].items():
                for b in s["branches"]:
                    w.writerow([entry["rate"], system, b["name"], b["priority"], b["prompt_tokens"],
                                len(b["tokens"]), b["stop_reason"], b["tokens"] == ref[b["name"]],
                                b["arrival_s"], b["queue_ms"], b["activation_ms"],
                                b["completion_ms"]])  # fmt: skip
    return path


def targets(entry: dict[str, Any]) -> list[tuple[str, float | None, str, float]]:
    """The issue's targets at one rate: (name, measured value, op, threshold); the value is
    None when a system it needs was not run (a policy or peer left out)."""
    s = entry["systems"]
    values = (
        _ratio(_get(s, "host-lock", "activation_ms", "p99"),
               _get(s, "swarm-fair", "activation_ms", "p99")),
        _ratio(_get(s, "swarm-fair", "tokens_per_s"), _get(s, "host-lock", "tokens_per_s")),
        _get(s, "swarm-fair", "fairness"),
        _ratio(_get(s, "swarm-fair", "tokens_per_s"), _get(s, "server-np1", "tokens_per_s")),
    )  # fmt: skip
    return [(n, v, op, t) for (n, op, t), v in zip(TARGETS, values, strict=True)]


def _get(systems: dict[str, System], name: str, *keys: str) -> float | None:
    value: Any = systems.get(name)
    for key in keys:
        value = None if value is None else value[key]
    return value


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def target_status(value: float | None, goal: float) -> str:
    """met / missed / n/a (not measured) for a >= target."""
    if value is None or math.isnan(value):
        return "n/a"
    return "met" if value >= goal else "missed"


def format_value(value: float | None) -> str:
    """A target's measured value with two decimals, or n/a."""
    return "n/a" if value is None else f"{value:.2f}"


def write_markdown(report: dict[str, Any], out_dir: Path) -> Path:
    """swarm_report.md: per rate, a table of every system's percentiles and fairness, the
    peers' server counters, and the targets."""
    o = report["options"]
    lines = [
        "# Swarm benchmark",
        "",
        f"Produced by `{report['command']}`.",
        "",
        "## Provenance",
        "",
        *summary_lines(report["provenance"]),
        "",
        f"{o['agents']} agents per rate arriving as a Poisson process (seed {o['seed']}), "
        f"n_predict uniform in {o['n_predict']}, a {o['doc_tokens']}-token document, at most "
        f"{o['max_live']} live branches in the swarm, {o['threads'] or 'all'} threads. "
        "Milliseconds from each agent's arrival. `host-lock` decodes one branch at a time in "
        "arrival order (the paper's design); its service times are each branch's time alone, "
        "the basis of the slowdown whose Jain index is `fairness` for every system. SwarmKV's "
        "systems (host-lock, swarm-*) use batch-invariant kernels and prefill the document "
        "before the first arrival. One run per rate: no spread.",
        "",
        *_peers_note(o.get("peers", [])),
    ]
    for entry in report["rates"]:
        lines += _rate_table(entry) + _peer_table(entry) + _target_table(entry)
    path = out_dir / "swarm_report.md"
    path.write_text("\n".join(lines))
    return path


def _peers_note(peers: list[str]) -> list[str]:
    if not peers:
        return ["Not measured here: llama-server peers (not built, or `--peers none`).", ""]
    return [
        f"Peers: llama.cpp's llama-server ({', '.join(peers)}) from the same vendored tree, "
        "greedy, --swa-full, a fresh server per rate, each request (document + prompt as one "
        "string) sent at its agent's arrival. `server-np1`: one slot with its prompt cache; a "
        "warm-up request of the document alone put it in the slot's cache before the first "
        "arrival (excluded). `server-npN`: max_live slots sharing one KV buffer "
        "(--kv-unified, continuous batching); `server-npNslots`: max_live slots, a KV cache "
        "each. The npN setups get no warm-up: each slot prefills the document itself, which "
        "is how that peer runs (the server counts below show what it evaluated). Queue: "
        "arrival to the response headers, which the server sends when a slot takes the "
        "request. The server is not batch invariant and tokenizes document + prompt as one "
        "string, so its tokens may differ from host-lock's: the share that match is shown.",
        "",
    ]


def _identical(s: System) -> str:
    if s["tokens_identical_to_host_lock"]:
        return "yes"
    share = s.get("tokens_identical_fraction", math.nan)
    return f"NO ({share:.0%} of branches)" if math.isfinite(share) else "NO"


def _rate_table(entry: dict[str, Any]) -> list[str]:
    head = ["system", "activation p50 / p95 / p99", "queue p99", "inter-token p50 / p99",
            "completion p50 / p99", "fairness", "tokens/s", "live (mean)",
            "tokens = host-lock"]  # fmt: skip
    rows = []
    for name, s in entry["systems"].items():
        a, q, it, c = s["activation_ms"], s["queue_ms"], s["inter_token_ms"], s["completion_ms"]
        rows.append([
            name, f"{a['p50']:.0f} / {a['p95']:.0f} / {a['p99']:.0f}", f"{q['p99']:.0f}",
            f"{it['p50']:.1f} / {it['p99']:.1f}", f"{c['p50']:.0f} / {c['p99']:.0f}",
            f"{s['fairness']:.3f}", f"{s['tokens_per_s']:.1f}",
            f"{live_branches(s['branches']):.1f}", _identical(s),
        ])  # fmt: skip
    return [f"## {entry['rate']:g} arrivals per second", "", *_table(head, rows)]


def live_branches(branches: list[dict[str, Any]]) -> float:
    """How many branches were in service at once, on average over the span from the first
    admission to the last token (time-weighted). In service: from admission (arrival +
    queue_ms) to the last token (arrival + completion_ms); failed branches (NaN times) are
    left out. A mean, not a maximum: host-lock and peer records time arrivals from the
    scheduled instant, so sleep jitter (milliseconds) can make two spans touch."""
    spans = [
        (b["arrival_s"] * 1000 + b["queue_ms"], b["arrival_s"] * 1000 + b["completion_ms"])
        for b in branches
        if math.isfinite(b["queue_ms"]) and math.isfinite(b["completion_ms"])
    ]
    if not spans:
        return math.nan
    width = max(e for _, e in spans) - min(s for s, _ in spans)
    busy = sum(e - s for s, e in spans)
    return busy / width if width > 0 else float(len(spans))


def _peer_table(entry: dict[str, Any]) -> list[str]:
    peers = {n: s for n, s in entry["systems"].items() if "server_start_ms" in s}
    if not peers:
        return []
    head = ["peer", "-np", "-c", "prompt tokens evaluated / from cache (server)", "failed",
            "ids not streamed", "server start ms (excluded)"]  # fmt: skip
    rows = [
        [name, str(s["n_parallel"]), str(s["n_ctx"]),
         f"{s.get('prompt_tokens_evaluated', math.nan):.0f} / "
         f"{s.get('prompt_tokens_cached', math.nan):.0f}",
         str(s["failed_branches"]), f"{s.get('token_ids_withheld', 0):.0f}",
         f"{s['server_start_ms']:.0f}"]
        for name, s in peers.items()
    ]  # fmt: skip
    return _table(head, rows)


def _target_table(entry: dict[str, Any]) -> list[str]:
    rows = [
        [name, format_value(value), f"{op} {goal}", target_status(value, goal)]
        for name, value, op, goal in targets(entry)
    ]
    return _table(["target", "measured", "goal", ""], rows)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, the first column left-aligned and the others right, then a blank."""
    return [_line(head), "|---|" + "--:|" * (len(head) - 1), *map(_line, rows), ""]


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
