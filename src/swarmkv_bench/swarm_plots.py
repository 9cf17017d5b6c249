"""The plots of `swarmkv bench --swarm`: per rate, CDFs of activation and completion latency
with one line per system (each swarm policy, the host lock, each llama-server peer); across
rates, p99 activation latency and aggregate tokens/s against the arrival rate."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

LATENCIES = (
    ("activation_ms", "activation latency, arrival to first token (ms)"),
    ("completion_ms", "completion latency, arrival to last token (ms)"),
)


def write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """plots/swarm_latency_cdf_<rate>.png for every rate; plots/swarm_by_rate.png when the
    report has more than one rate."""
    plots = out_dir / "plots"
    plots.mkdir(exist_ok=True)
    paths = [_latency_cdfs(entry, plots) for entry in report["rates"]]
    if len(report["rates"]) > 1:
        paths.append(_by_rate(report, plots))
    return paths


def _latency_cdfs(entry: dict[str, Any], plots: Path) -> Path:
    fig = Figure(figsize=(11, 4))
    for k, (key, label) in enumerate(LATENCIES):
        ax = fig.add_subplot(1, len(LATENCIES), k + 1)
        for name, s in entry["systems"].items():
            # a failed peer request has no latency (NaN): the CDF is over those that finished
            xs = sorted(v for b in s["branches"] if math.isfinite(v := b[key]))
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlap
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of agents")
        ax.set_title(f"{entry['rate']:g} arrivals/s")
    _legend(ax)
    return _save(fig, plots / f"swarm_latency_cdf_{entry['rate']:g}.png")


def _by_rate(report: dict[str, Any], plots: Path) -> Path:
    fig = Figure(figsize=(11, 4))
    p99, tps = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = dict.fromkeys(n for e in report["rates"] for n in e["systems"])
    for name in names:  # a system missing at some rate just has fewer points
        at = [(e["rate"], e["systems"][name]) for e in report["rates"] if name in e["systems"]]
        rates = [r for r, _ in at]
        p99.plot(rates, [s["activation_ms"]["p99"] for _, s in at], marker="o", label=name)
        tps.plot(rates, [s["tokens_per_s"] for _, s in at], marker="o", label=name)
    p99.set_yscale("log")
    p99.set_xlabel("arrivals per second")
    p99.set_ylabel("p99 activation latency (ms)")
    tps.set_xlabel("arrivals per second")
    tps.set_ylabel("aggregate generated tokens per second")
    _legend(tps)
    return _save(fig, plots / "swarm_by_rate.png")


def _legend(ax: Axes) -> None:
    ax.legend(fontsize=8)


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
