"""The bench plots: one function each, writing `<out_dir>/plots/<name>.png`.

Every function returns the PNG's path, or None (logged) when the data for that plot is absent,
e.g. scaling with N when only one N was run. Figures are drawn on the Agg canvas directly,
without pyplot, so no global backend is switched and nothing needs a display.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullFormatter

from .metrics import ModeSummary, Stat
from .records import TrialRecord

log = logging.getLogger("swarmkv.bench")

Summaries = dict[tuple[str, str], ModeSummary]
MIB = 1024 * 1024
MAX_PANELS = 9  # trial-consistency panels; more configs than this would be unreadable


def plot_e2e(summaries: Summaries, out_dir: str | Path) -> Path | None:
    """End-to-end latency per mode per config: median bars, min–max error bars."""
    configs = _configs(summaries)
    if not any(s.e2e_ms for s in summaries.values()):
        return _skip("e2e", "no e2e_ms")
    fig, ax = _figure(max(6.0, 1.6 * len(configs)))
    _grouped_bars(ax, configs, _modes(summaries), lambda c, m: _stat(summaries, c, m))
    ax.set_ylabel("e2e_ms (median, min–max)")
    ax.set_title("End-to-end latency per mode")
    return _save(fig, out_dir, "e2e")


def plot_activation(
    summaries: Summaries, out_dir: str | Path, config_id: str | None = None
) -> Path | None:
    """branch_activation_ms[i] per branch and mode for one config (default: the first)."""
    cfg = config_id or next(iter(_configs(summaries)), None)
    group = {m: s for (c, m), s in summaries.items() if c == cfg}
    width = max((len(s.branch_activation_ms) for s in group.values()), default=0)
    if not any(st for s in group.values() for st in s.branch_activation_ms):
        return _skip("activation", f"no activation data for config {cfg}")
    fig, ax = _figure(max(6.0, 0.9 * width * max(1, len(group))))
    labels = [f"branch {i + 1}" for i in range(width)]
    _grouped_bars(
        ax,
        labels,
        list(group),
        lambda lab, m: _at(group[m].branch_activation_ms, labels.index(lab)),
    )
    ax.set_yscale("log")
    ax.set_ylabel("branch_activation_ms (log)")
    ax.set_title(f"Branch activation, {cfg}")
    return _save(fig, out_dir, "activation")


def plot_prefill_breakdown(
    summaries: Summaries, out_dir: str | Path, config_id: str | None = None
) -> Path | None:
    """Work summed over branches per trial (medians): prefill, restore + fork copy, decode."""
    cfg = config_id or next(iter(_configs(summaries)), None)
    group = {m: s for (c, m), s in summaries.items() if c == cfg}
    parts: list[tuple[str, Callable[[ModeSummary], float | None]]] = [
        ("prefill", lambda s: s.prefill_work_ms()),
        ("restore + fork copy", lambda s: _med(s.restore_total_ms)),
        ("decode", lambda s: _med(s.decode_total_ms)),
    ]
    if not any(get(s) for s in group.values() for _, get in parts):
        return _skip("prefill_breakdown", f"no cost data for config {cfg}")
    fig, ax = _figure(max(6.0, 1.7 * len(group)))
    bottom = [0.0] * len(group)
    # A peer's prefill happens inside its server: say so instead of drawing a silent zero.
    names = [m if s.prefill_work_ms() else f"{m}\n(no prefill data)" for m, s in group.items()]
    for label, get in parts:
        heights = [get(s) or 0.0 for s in group.values()]
        ax.bar(names, heights, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("ms of work per trial (median)")
    ax.set_title(f"Prefill-cost breakdown, {cfg} (summed over branches, which may overlap)")
    _legend(ax)
    return _save(fig, out_dir, "prefill_breakdown")


def plot_trials(records: Sequence[TrialRecord], out_dir: str | Path) -> Path | None:
    """e2e_ms of every trial in run order, one panel per config (warm-ups as crosses)."""
    configs = list(dict.fromkeys(r.config_id for r in records))[:MAX_PANELS]
    if not configs:
        return _skip("trials", "no records")
    cols = min(3, len(configs))
    rows = -(-len(configs) // cols)
    fig = Figure(figsize=(5.0 * cols, 3.6 * rows), layout="constrained")
    for k, cfg in enumerate(configs):
        ax = fig.add_subplot(rows, cols, k + 1)
        for mode in dict.fromkeys(r.mode for r in records if r.config_id == cfg):
            mine = [r for r in records if (r.config_id, r.mode) == (cfg, mode)]
            timed = [r for r in mine if not r.is_warmup]
            line = ax.plot([r.trial for r in timed], [r.e2e_ms for r in timed], "o-", label=mode)
            warm = [r for r in mine if r.is_warmup]
            ax.plot(
                [r.trial for r in warm], [r.e2e_ms for r in warm], "x", color=line[0].get_color()
            )
        ax.set_title(cfg, fontsize=9)
        ax.set_xlabel("trial")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("e2e_ms")
        _legend(ax, 7)
    return _save(fig, out_dir, "trials")


def plot_scaling_branches(summaries: Summaries, out_dir: str | Path) -> Path | None:
    """e2e and activation against the number of branches N (log-log), other settings fixed."""
    return _scaling(summaries, out_dir, "n_branches", "branches N", "scaling_branches")


def plot_scaling_doc(summaries: Summaries, out_dir: str | Path) -> Path | None:
    """e2e and activation against document length in tokens, other settings fixed."""
    return _scaling(summaries, out_dir, "doc_tokens", "document tokens", "scaling_doc")


def plot_memory(
    summaries: Summaries, out_dir: str | Path, config_id: str | None = None
) -> Path | None:
    """Peak RSS, resident KV and snapshot bytes per mode for one config (MiB)."""
    cfg = config_id or next(iter(_configs(summaries)), None)
    group = {m: s for (c, m), s in summaries.items() if c == cfg}
    series: dict[str, Callable[[ModeSummary], Stat | None]] = {
        "peak RSS": lambda s: s.peak_rss_bytes,
        "KV cache": lambda s: s.kv_bytes,
        "snapshot": lambda s: s.snapshot_bytes,
    }
    # Peers measured out of process have no memory numbers: leave them off rather than at 0.
    group = {m: s for m, s in group.items() if any(get(s) for get in series.values())}
    if not group:
        return _skip("memory", f"no memory data for config {cfg}")
    fig, ax = _figure(max(6.0, 1.5 * len(group)))
    _grouped_bars(
        ax, list(group), list(series), lambda m, name: _scaled(series[name](group[m]), 1 / MIB)
    )
    ax.set_ylabel("MiB (median, min–max)")
    ax.set_title(f"Memory, {cfg}")
    return _save(fig, out_dir, "memory")


def make_all_plots(
    records: Sequence[TrialRecord],
    summaries: Summaries,
    out_dir: str | Path,
    config_id: str | None = None,
) -> list[Path]:
    """Every plot the data allows; one failing plot is logged, never fatal to the run."""
    jobs: list[tuple[str, Callable[[], Path | None]]] = [
        ("e2e", lambda: plot_e2e(summaries, out_dir)),
        ("activation", lambda: plot_activation(summaries, out_dir, config_id)),
        ("prefill_breakdown", lambda: plot_prefill_breakdown(summaries, out_dir, config_id)),
        ("trials", lambda: plot_trials(records, out_dir)),
        ("scaling_branches", lambda: plot_scaling_branches(summaries, out_dir)),
        ("scaling_doc", lambda: plot_scaling_doc(summaries, out_dir)),
        ("memory", lambda: plot_memory(summaries, out_dir, config_id)),
    ]
    paths: list[Path] = []
    for name, job in jobs:
        try:
            path = job()
        except Exception:  # a broken plot must not cost the measurements already taken
            log.exception("plot %s failed", name)
            continue
        if path is not None:
            paths.append(path)
    return paths


def _scaling(
    summaries: Summaries, out_dir: str | Path, vary: str, xlabel: str, name: str
) -> Path | None:
    # Only configs that differ in `vary` alone are comparable: group by everything else.
    fixed = [k for k in ("n_branches", "doc_tokens", "n_predict") if k != vary]
    groups: dict[tuple[int, ...], list[ModeSummary]] = {}
    for s in summaries.values():
        groups.setdefault(tuple(getattr(s, k) for k in fixed), []).append(s)
    best = max(groups.values(), key=lambda g: len({getattr(s, vary) for s in g}), default=[])
    if len({getattr(s, vary) for s in best}) < 2:
        return _skip(name, f"fewer than two values of {vary}")
    fig = Figure(figsize=(11.0, 4.2), layout="constrained")
    metrics: list[tuple[str, Callable[[ModeSummary], float | None]]] = [
        ("e2e_ms (median)", lambda s: _med(s.e2e_ms)),
        ("branch_activation_ms (median over branches)", _activation_overall),
    ]
    for k, (label, get) in enumerate(metrics):
        ax = fig.add_subplot(1, 2, k + 1)
        for mode in dict.fromkeys(s.mode for s in best):
            vals = [(getattr(s, vary), get(s)) for s in best if s.mode == mode]
            pts = sorted((x, y) for x, y in vals if y is not None and y > 0)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", label=mode)
        ax.set_xscale("log")
        ax.set_yscale("log")
        xs = sorted({getattr(s, vary) for s in best})
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        _legend(ax, 8)
    fig.suptitle(", ".join(f"{k}={getattr(best[0], k)}" for k in fixed))
    return _save(fig, out_dir, name)


def _grouped_bars(
    ax: Axes,
    groups: Sequence[str],
    series: Sequence[str],
    get: Callable[[str, str], Stat | None],
) -> None:
    """Bars at median height for each (group, series), min–max as asymmetric error bars."""
    width = 0.8 / max(1, len(series))
    for j, name in enumerate(series):
        stats = [get(g, name) for g in groups]
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        heights = [st.median if st else 0.0 for st in stats]
        err = [
            [st.median - st.min if st else 0.0 for st in stats],
            [st.max - st.median if st else 0.0 for st in stats],
        ]
        ax.bar(xs, heights, width, yerr=err, capsize=3, label=name)
    ax.set_xticks(range(len(groups)), list(groups), rotation=20, ha="right", fontsize=8)
    _legend(ax, 8)


def _figure(width: float) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(min(width, 16.0), 4.5), layout="constrained")
    return fig, fig.add_subplot(1, 1, 1)


def _legend(ax: Axes, fontsize: int = 8) -> None:
    """Outside the axes, on the right: a legend must never cover bars or lines."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _save(fig: Figure, out_dir: str | Path, name: str) -> Path:
    path = Path(out_dir) / "plots" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig).print_png(str(path))
    log.info("wrote plot %s", path)
    return path


def _skip(name: str, why: str) -> Path | None:
    log.info("plot %s skipped: %s", name, why)
    return None


def _configs(summaries: Summaries) -> list[str]:
    return list(dict.fromkeys(c for c, _ in summaries))


def _modes(summaries: Summaries) -> list[str]:
    return list(dict.fromkeys(m for _, m in summaries))


def _stat(summaries: Summaries, config_id: str, mode: str) -> Stat | None:
    s = summaries.get((config_id, mode))
    return s.e2e_ms if s else None


def _at(stats: Sequence[Stat | None], i: int) -> Stat | None:
    return stats[i] if i < len(stats) else None


def _med(stat: Stat | None) -> float | None:
    return stat.median if stat else None


def _scaled(stat: Stat | None, k: float) -> Stat | None:
    if stat is None:
        return None
    return Stat(stat.median * k, stat.min * k, stat.max * k, stat.q1 * k, stat.q3 * k, stat.n)


def _activation_overall(s: ModeSummary) -> float | None:
    meds = [st.median for st in s.branch_activation_ms if st]
    return statistics.median(meds) if meds else None
