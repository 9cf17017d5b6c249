"""The outputs of `swarmkv bench --swarm`: CSV, a Markdown report, latency CDF plots."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

TARGETS = (
    ("p99 activation: host-lock / swarm-fair", ">=", 5.0),
    ("tokens/s: swarm-fair / host-lock", ">=", 1.5),
    ("Jain's index of slowdown, swarm-fair", ">=", 0.9),
)


def write_csv(report: dict[str, Any], out_dir: Path) -> Path:
    """swarm.csv: one row per rate, system and branch."""
    path = out_dir / "swarm.csv"
    cols = ["rate", "system", "name", "priority", "prompt_tokens", "n_tokens", "arrival_s",
            "queue_ms", "activation_ms", "completion_ms"]  # fmt: skip
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for entry in report["rates"]:
            for system, s in entry["systems"].items():
                for b in s["branches"]:
                    w.writerow([entry["rate"], system, b["name"], b["priority"], b["prompt_tokens"],
                                len(b["tokens"]), b["arrival_s"], b["queue_ms"],
                                b["activation_ms"], b["completion_ms"]])  # fmt: skip
    return path


def targets(entry: dict[str, Any]) -> list[tuple[str, float | None, str, float]]:
    """The issue's targets at one rate: (name, measured value, op, threshold)."""
    s = entry["systems"]
    fair, host = s.get("swarm-fair"), s.get("host-lock")
    if fair is None or host is None:
        return []
    values = (
        host["activation_ms"]["p99"] / fair["activation_ms"]["p99"],
        fair["tokens_per_s"] / host["tokens_per_s"],
        fair["fairness"],
    )
    return [(n, v, op, t) for (n, op, t), v in zip(TARGETS, values, strict=True)]


def write_markdown(report: dict[str, Any], out_dir: Path) -> Path:
    """swarm_report.md: per rate, a table of every system's percentiles and fairness."""
    o = report["options"]
    lines = [
        "# Swarm benchmark",
        "",
        f"Produced by `{report['command']}`.",
        "",
        f"{o['agents']} agents per rate arriving as a Poisson process (seed {o['seed']}), "
        f"n_predict uniform in {o['n_predict']}, a {o['doc_tokens']}-token document prefilled "
        f"before the first arrival, at most {o['max_live']} live branches in the swarm, "
        f"{o['threads'] or 'all'} threads, batch-invariant kernels everywhere. Milliseconds "
        "from each agent's arrival. `host-lock` decodes one branch at a time in arrival order "
        "(the paper's design); its service times are each branch's time alone, the basis of "
        "the slowdown whose Jain index is `fairness`. One run per rate: no spread.",
        "",
    ]
    for entry in report["rates"]:
        lines += _rate_table(entry)
    lines += [
        "Not measured here: llama-server with `-np N` and `-np 1` with its prompt cache on the "
        "same arrivals.",
        "",
    ]
    path = out_dir / "swarm_report.md"
    path.write_text("\n".join(lines))
    return path


def _rate_table(entry: dict[str, Any]) -> list[str]:
    rows = [
        f"## {entry['rate']:g} arrivals per second",
        "",
        "| system | activation p50 / p95 / p99 | queue p99 | inter-token p50 / p99 | "
        "completion p50 / p99 | fairness | tokens/s | tokens = host-lock |",
        "|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for name, s in entry["systems"].items():
        a, q, it, c = s["activation_ms"], s["queue_ms"], s["inter_token_ms"], s["completion_ms"]
        rows.append(
            f"| {name} | {a['p50']:.0f} / {a['p95']:.0f} / {a['p99']:.0f} | {q['p99']:.0f} | "
            f"{it['p50']:.1f} / {it['p99']:.1f} | {c['p50']:.0f} / {c['p99']:.0f} | "
            f"{s['fairness']:.3f} | {s['tokens_per_s']:.1f} | "
            f"{'yes' if s['tokens_identical_to_host_lock'] else 'NO'} |"
        )
    rows += ["", "| target | measured | goal | |", "|---|--:|--:|---|"]
    for name, value, op, goal in targets(entry):
        ok = value is not None and value >= goal
        rows.append(f"| {name} | {value:.2f} | {op} {goal} | {'met' if ok else 'missed'} |")
    return [*rows, ""]


def write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """A CDF of activation latency per system at each rate, and p99 / tokens/s by rate."""
    plots = out_dir / "plots"
    plots.mkdir(exist_ok=True)
    paths = []
    for entry in report["rates"]:
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        for name, s in entry["systems"].items():
            xs = sorted(b["activation_ms"] for b in s["branches"])
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("activation latency, arrival to first token (ms)")
        ax.set_ylabel("fraction of agents")
        ax.set_title(f"{entry['rate']:g} arrivals/s")
        ax.legend()
        paths.append(_save(fig, plots / f"swarm_activation_cdf_{entry['rate']:g}.png"))
    if len(report["rates"]) > 1:
        paths.append(_by_rate(report, plots))
    return paths


def _by_rate(report: dict[str, Any], plots: Path) -> Path:
    fig = Figure(figsize=(10, 4))
    p99, tps = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    rates = [e["rate"] for e in report["rates"]]
    for name in report["rates"][0]["systems"]:
        p99.plot(rates, [e["systems"][name]["activation_ms"]["p99"] for e in report["rates"]],
                 marker="o", label=name)  # fmt: skip
        tps.plot(rates, [e["systems"][name]["tokens_per_s"] for e in report["rates"]],
                 marker="o", label=name)  # fmt: skip
    p99.set_yscale("log")
    p99.set_xlabel("arrivals per second")
    p99.set_ylabel("p99 activation latency (ms)")
    tps.set_xlabel("arrivals per second")
    tps.set_ylabel("generated tokens per second")
    tps.legend()
    return _save(fig, plots / "swarm_by_rate.png")


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
