"""serve_report.md and plots/ of `swarmkv bench --serve`: per workload, per rate, every system
on one table (medians over the seeds, [min-max] where the seeds differ), the targets, and the
plots: time-to-first-token CDFs per rate, p99 and tokens/s against the rate."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from . import cpu_split
from .provenance import patch_numbers, summary_lines

COLUMNS = (
    ("offered tok/s", None),
    ("utilization", "utilization"),
    ("TTFT p50 ms", "ttft_p50_ms"),
    ("TTFT p99 ms", "ttft_p99_ms"),
    ("queue p99 ms", "queue_p99_ms"),
    ("ITL p50 ms", "itl_p50_ms"),
    ("tok/s", "tokens_per_s"),
    ("Jain (slowdown)", "jain_slowdown"),
    ("prompt computed", "prompt_tokens_computed"),
    ("prompt reused", "prompt_tokens_reused"),
    ("peak RSS MiB", "peak_rss_bytes"),
)


def _cell(v: list[float] | None, key: str | None) -> str:
    if v is None:
        return "n/a"
    scale = 1 / 2**20 if key == "peak_rss_bytes" else 1.0
    med, lo, hi = (x * scale for x in v)
    fmt = (
        "{:.2f}"
        if key in ("utilization", "jain_slowdown")
        else "{:.0f}"
        if med >= 100
        else "{:.1f}"
    )
    shown = fmt.format(med)
    return (
        shown
        if fmt.format(lo) == fmt.format(hi)
        else f"{shown} [{fmt.format(lo)}-{fmt.format(hi)}]"
    )


def _offered(work: dict[str, Any], rate: Any) -> str:
    runs = [r for r in work["runs"] if r["rate"] == rate and r["offered_tokens_per_s"]]
    return f"{runs[0]['offered_tokens_per_s']:.1f}" if runs else "burst"


def workload_section(name: str, work: dict[str, Any]) -> list[str]:
    lines = [
        f"## {name}",
        "",
        f"{work['agents']} agents, {work['requests']} requests, "
        f"{work['heads']} shared heads, {work['n_predict']} tokens each.",
        "",
    ]
    head = ["rate", "system", *(c for c, _ in COLUMNS), "errors", "as alone", "past capacity"]
    for entry in work["by_rate"]:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for system, row in entry["summary"].items():
            cells = [
                _offered(work, entry["rate"]) if k is None else _cell(row[k], k) for _, k in COLUMNS
            ]
            past = ", ".join(
                "?" if p is None else "yes" if p else "no" for p in row["past_capacity"]
            )
            lines.append(
                f"| {entry['rate']} | {system} | "
                + " | ".join(cells)
                + f" | {row['errors']} | {row['identical_to_alone']} | {past} |"
            )
        lines.append("")
    return lines + cpu_section(work)


def targets_section(targets: list[dict[str, Any]]) -> list[str]:
    """The issue's targets this run judged, or a line saying none applies (they are set for
    workloads (a) and (b): a run of (c) or (d) alone judges none)."""
    from .serve_command import target_lines  # serve_command imports this module

    lines = target_lines(targets)
    body = ["```", *lines, "```"] if lines else ["No target applies to the workloads of this run."]
    return ["## Targets", "", *body, ""]


def cpu_section(work: dict[str, Any]) -> list[str]:
    """Where the cores went: CPU ms per generated token by process group (cpu_split.py)."""
    rows = [
        (entry["rate"], system, row.get("cpu_ms_per_token") or {})
        for entry in work["by_rate"]
        for system, row in entry["summary"].items()
    ]
    groups = [g for g in cpu_split.GROUP_ORDER if any(g in split for _, _, split in rows)]
    if not groups:
        return []
    head = ["rate", "system", *groups]
    lines = [
        "CPU ms per generated token while the load ran, by process group (idle: the cores' "
        "time no thread used):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for rate, system, split in rows:
        cells = [_cell(split.get(g), None) if g in split else "" for g in groups]
        lines.append(f"| {rate} | {system} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def peer_binary_lines(
    info: dict[str, Any] | None, library: dict[str, Any] | None = None
) -> list[str]:
    """The llama-server peers' binary and its tree's patches (built apart from SwarmKV's
    library, so they may differ from the provenance block's). library: that provenance
    block; the line then says whether the peers' tree and the library's are the same."""
    if info is None:
        return []
    tree = info.get("tree")
    patches = (
        patch_numbers(tree["patches"]) or "none"
        if tree
        else "unknown (no stamp beside the binary: not built by bench/build_llama_server.sh)"
    )
    commit = tree["commit"] if tree else "unknown"
    binary = info["binary"]
    line = f"- peers' llama-server: {binary}; llama.cpp commit: {commit}, patches: {patches}"
    if tree and library:
        line += "; " + tree_against_library(tree, library)
    return [line]


def tree_against_library(tree: dict[str, Any], library: dict[str, Any]) -> str:
    """Whether the peers' tree is the library's: the same commit and the same patches, each
    with the same file hash (a stamp from before hashes were kept compares by name only).
    A patch file's hash changes when it is edited, and also when a patch is added to the
    series (each file's subject numbers it: [PATCH 01/12]), so same names with other hashes
    are said as such."""
    if tree["commit"] != library["llama_cpp_commit"]:
        return f"another llama.cpp commit than SwarmKV's library ({library['llama_cpp_commit']})"
    peer, lib = set(tree["patches"]), set(library["patches"])
    if peer == lib:
        return "the same tree as SwarmKV's library"
    names_peer = {p.rsplit(":", 1)[0] for p in peer}
    names_lib = {p.rsplit(":", 1)[0] for p in lib}
    if names_peer == names_lib:
        hashed = all(":" in p for p in peer | lib)
        if not hashed:
            return "the same tree as SwarmKV's library (patch names)"
        other = len(peer - lib)
        return (
            f"the same patches as SwarmKV's library by name, {other} with another file hash "
            "(edited, or renumbered when a patch was added)"
        )
    only_peer = patch_numbers(sorted(names_peer - names_lib)) or "none"
    only_lib = patch_numbers(sorted(names_lib - names_peer)) or "none"
    return (
        f"not SwarmKV's library's tree (only the peers': {only_peer}; "
        f"only the library's: {only_lib})"
    )


def write_report(result: dict[str, Any], out: Path) -> list[Path]:
    """serve_report.md and the plots; returns the paths written."""
    lines = ["# swarmkv bench --serve", "", *summary_lines(result["provenance"])]
    lines += [*peer_binary_lines(result.get("peer_binary"), result["provenance"]), ""]
    lines += [
        "Utilization is offered tokens/s over the system's most tokens/s at any rate of the "
        "run (a burst, with --burst); past capacity, a system's latency is set by the burst "
        "of arrivals, not by its scheduler. Queue time is time to first token less the same "
        "request's alone. Slowdown is completion time over the same request's alone.",
        "",
    ]
    lines += targets_section(result["targets"])
    for name, work in result["workloads"].items():
        lines += workload_section(name, work)
    path = out / "serve_report.md"
    path.write_text("\n".join(lines) + "\n")
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    written = [path]
    for name, work in result["workloads"].items():
        written.append(_cdfs(name, work, plots))
        numeric = [e for e in work["by_rate"] if e["rate"] != "burst"]
        if len(numeric) > 1:
            written.append(_by_rate(name, numeric, plots))
    return written


def _cdfs(name: str, work: dict[str, Any], plots: Path) -> Path:
    rates = [e["rate"] for e in work["by_rate"]]
    fig = Figure(figsize=(5 * len(rates), 4))
    for k, rate in enumerate(rates):
        ax = fig.add_subplot(1, len(rates), k + 1)
        systems = dict.fromkeys(f"{r['system']}/{r['kernels']}" for r in work["runs"])
        for system in systems:  # every seed's requests together
            xs = sorted(
                q["ttft_ms"]
                for r in work["runs"]
                if r["rate"] == rate and f"{r['system']}/{r['kernels']}" == system
                for q in r["requests_log"]
                if q["ttft_ms"] is not None
            )
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=system)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("time to first token (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name}, rate {rate}")
        ax.legend(fontsize=7)
    return _save(fig, plots / f"serve_{name}_ttft_cdf.png")


def _by_rate(name: str, entries: list[dict[str, Any]], plots: Path) -> Path:
    fig = Figure(figsize=(11, 4))
    p99, tps = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    systems = dict.fromkeys(s for e in entries for s in e["summary"])
    for system in systems:
        at = [(e["rate"], e["summary"][system]) for e in entries if system in e["summary"]]
        xs = [rate for rate, _ in at]
        p99.plot(
            xs,
            [row["ttft_p99_ms"][0] if row["ttft_p99_ms"] else math.nan for _, row in at],
            marker="o",
            label=system,
        )
        tps.plot(
            xs,
            [row["tokens_per_s"][0] if row["tokens_per_s"] else math.nan for _, row in at],
            marker="o",
            label=system,
        )
    p99.set_yscale("log")
    p99.set_xlabel("agent arrivals per second")
    p99.set_ylabel("p99 time to first token (ms, median over seeds)")
    tps.set_xlabel("agent arrivals per second")
    tps.set_ylabel("generated tokens per second")
    tps.legend(fontsize=7)
    return _save(fig, plots / f"serve_{name}_by_rate.png")


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
