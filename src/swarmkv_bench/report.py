"""report.md: what was run, on what, the medians and spread, speedups, targets, limitations.

A result is only quoted with the command that produced it, so the command leads the report.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from swarmkv.errors import ConfigError

from .metrics import ModeSummary, Speedup, Stat
from .modes import PEER_PREFIX
from .provenance import summary_lines
from .records import TrialRecord

log = logging.getLogger("swarmkv.bench")

OPS = (">=", "<=")
MIB = 1024 * 1024
MAX_BRANCH_COLUMNS = 8  # wider per-branch tables stop being readable; the JSON has them all
# Setup keys every report shows first, in this order ("not recorded" when absent); the
# table labels them by key so they read the same as best_run.json's "setup".
SETUP_KEYS = (
    "model", "llama_cpp_commit", "patches", "swarmkv_commit", "build", "threads", "cpu",
    "ggml_cpu_features", "gpu", "host_pool", "kv_dtype", "swa_full", "flash_attn", "n_ctx",
    "n_batch", "trials", "warmup",
)  # fmt: skip


@dataclass(frozen=True)
class Target:
    """A goal read off the measurements: `value op threshold` (e.g. speedup >= 1.5)."""

    name: str
    value: float | None  # None: not measured in this run, which never counts as a pass
    threshold: float
    op: str  # ">=" or "<="
    unit: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ConfigError(f"Target op must be one of {OPS}, got {self.op!r}")

    @property
    def passed(self) -> bool:
        """Whether value meets the threshold; a missing or non-finite value never passes."""
        if self.value is None or not math.isfinite(self.value):
            return False
        return self.value >= self.threshold if self.op == ">=" else self.value <= self.threshold

    @property
    def status(self) -> str:
        """PASS or FAIL, or NOT MEASURED when the value is missing or non-finite."""
        if self.value is None or not math.isfinite(self.value):
            return "NOT MEASURED"
        return "PASS" if self.passed else "FAIL"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields plus passed and status."""
        return asdict(self) | {"passed": self.passed, "status": self.status}


def write_report(
    path: str | Path,
    setup: dict[str, Any],
    summaries: dict[tuple[str, str], ModeSummary],
    speedups: Sequence[Speedup],
    records: Sequence[TrialRecord],
    targets: Sequence[Target],
    limitations: Sequence[str],
    plots: Sequence[Path],
    command: str,
) -> Path:
    """Render report.md; plots are linked relative to the report's folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = [
        "# SwarmKV benchmark report",
        "",
        "Produced by:",
        "",
        "```",
        command,
        "```",
        "",
        *_fidelity_section(records),
        *_provenance_section(setup.get("provenance")),
        *_setup_section(setup),
        *_results_section(summaries, {sp.baseline_mode for sp in speedups}),
        *_speedup_section(speedups),
        *_targets_section(targets),
        *_plots_section(plots, path.parent),
        "## Limitations",
        "",
        *([f"- {item}" for item in limitations] or ["- none stated"]),
        "",
    ]
    path.write_text("\n".join(parts), encoding="utf-8")
    log.info("wrote %s", path)
    return path


def _fidelity_section(records: Sequence[TrialRecord]) -> list[str]:
    bad = [r for r in records if r.fidelity_ok is False]
    ties = [r for r in records if r.extra.get("fidelity_near_ties", 0) > 0]
    checked = sum(r.fidelity_ok is not None for r in records)
    # every near-tie is listed, whatever else the run found (measuring.md)
    tie_lines = [
        f"- near-tie divergence (allowed, see measuring.md): {_where(r)}: {r.fidelity_detail}"
        for r in ties
    ]
    if not bad:
        also = f", or diverged only at proven near-ties ({len(ties)}, listed)" if ties else ""
        lines = [f"Fidelity: all {checked} checked trials equal the baseline's token ids{also}."]
        return [*lines, *tie_lines, ""]
    lines = ["## FIDELITY MISMATCH", "", _mismatch_headline(bad, checked), ""]
    lines += [f"- **{_where(r)}**: {r.fidelity_detail}" for r in bad]
    return [*lines, *tie_lines, ""]


def _mismatch_headline(bad: Sequence[TrialRecord], checked: int) -> str:
    """Whose answers differed: a SwarmKV mode's is a bug here; a llama-server peer's cannot be
    judged a near-tie (a server returns no logits), so its comparison is not like for like."""
    head = f"**{len(bad)} of {checked} checked trials produced tokens different from the baseline's"
    if any(not r.mode.startswith(PEER_PREFIX) for r in bad):
        return (
            f"{head}, and not as a near-tie. This is a bug; do not quote these speedups until "
            "it is fixed.**"
        )
    return (
        f"{head}, all of them llama-server peers' (a server returns no logits, so a divergence "
        "cannot be proven a near-tie). SwarmKV's own modes did not mismatch. The peers' "
        "timings compare with a server that did not give the baseline's answers.**"
    )


def _where(r: TrialRecord) -> str:
    return f"{r.config_id} / {r.mode} / trial {r.trial}{' (warm-up)' if r.is_warmup else ''}"


def _provenance_section(block: dict[str, Any] | None) -> list[str]:
    if block is None:
        return ["## Provenance", "", "- not recorded", ""]
    return ["## Provenance", "", *summary_lines(block), ""]


def _setup_section(setup: dict[str, Any]) -> list[str]:
    rows = [(key, setup.get(key, "not recorded")) for key in SETUP_KEYS]
    rows += [(k, v) for k, v in setup.items() if k not in SETUP_KEYS and k != "provenance"]
    return [
        "## Setup",
        "",
        "| | |",
        "|---|---|",
        *[f"| {label} | {_esc(value)} |" for label, value in rows],
        "",
    ]


def _results_section(
    summaries: dict[tuple[str, str], ModeSummary], references: set[str]
) -> list[str]:
    lines = [
        "## Results",
        "",
        "Medians over the measured trials (warm-up excluded), [min–max] and IQR as the "
        "spread; milliseconds. `branch_activation_ms[1]` is the seed paper's branch 2 "
        "activation latency. Best e2e is the fastest single trial, an extra only.",
        "",
    ]
    for config_id in dict.fromkeys(c for c, _ in summaries):
        group = [s for (c, _), s in summaries.items() if c == config_id]
        first = group[0]
        lines += [
            f"### {config_id}: N={first.n_branches} branches, "
            f"{first.doc_tokens} document tokens, n_predict={first.n_predict}",
            "",
            "| mode | trials | e2e_ms median [min–max] | e2e IQR | best e2e | prefill_ms "
            "| branch_activation_ms[1] | first_token_ms[1] | first_token_ms[last] "
            "| restore_ms (all branches) | tokens_per_s | peak RSS, own process (MiB) "
            "| fidelity |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        ]
        lines += [_summary_row(s, s.mode in references) for s in group]
        lines += ["", *_activation_table(group), ""]
    return lines


def _activation_table(group: Sequence[ModeSummary]) -> list[str]:
    width = min(MAX_BRANCH_COLUMNS, max(len(s.branch_activation_ms) for s in group))
    if width == 0:
        return []
    head = " | ".join(f"[{i}]" for i in range(width))
    lines = [
        "branch_activation_ms[i], median [min–max]:",
        "",
        f"| mode | {head} |",
        "|---|" + "--:|" * width,
    ]
    for s in group:
        cells = [
            _spread(s.branch_activation_ms[i] if i < len(s.branch_activation_ms) else None)
            for i in range(width)
        ]
        lines.append(f"| {s.mode} | " + " | ".join(cells) + " |")
    return lines


def _summary_row(s: ModeSummary, reference: bool) -> str:
    act = s.branch_activation_ms[1] if len(s.branch_activation_ms) > 1 else None
    e2e = s.e2e_ms
    cells = [
        s.mode,
        str(s.n_trials),
        _spread(e2e),
        _ms(e2e.iqr if e2e else None),
        _ms(e2e.min if e2e else None),
        _ms(_med(s.prefill_ms)),
        _spread(act),
        _spread(s.first_token_ms[1] if len(s.first_token_ms) > 1 else None),
        _spread(s.first_token_ms[-1] if s.first_token_ms else None),
        _ms(_med(s.restore_all_ms)),
        _num(_med(s.tokens_per_s)),
        _num(s.peak_rss_bytes.median / MIB if s.peak_rss_bytes else None),
        _fidelity_cell(s, reference),
    ]
    return "| " + " | ".join(cells) + " |"


def _fidelity_cell(s: ModeSummary, reference: bool) -> str:
    if s.fidelity_checked == 0:
        return "reference" if reference else "not checked"
    if s.fidelity_failed:
        return f"**MISMATCH {s.fidelity_failed}/{s.fidelity_checked}**"
    return f"ok {s.fidelity_ok}/{s.fidelity_checked}"


def _speedup_section(speedups: Sequence[Speedup]) -> list[str]:
    if not speedups:
        return ["## Speedups", "", "No reference mode was run, so no speedups.", ""]
    lines = [
        "## Speedups",
        "",
        "Ratios of medians: reference / mode (above 1 means the mode is faster). "
        "`redundant_prefill_eliminated_ms` is the reference's prefill work (one per "
        "branch) minus the mode's.",
        "",
        "| config | mode | vs | speedup_e2e | speedup_activation[1] "
        "| speedup_activation min–max | redundant_prefill_eliminated_ms |",
        "|---|---|---|--:|--:|--:|--:|",
    ]
    for sp in speedups:
        acts = [a for a in sp.speedup_activation if a is not None]
        span = f"{min(acts):.2f}–{max(acts):.2f}" if acts else "–"
        lines.append(
            f"| {sp.config_id} | {sp.mode} | {sp.baseline_mode} | "
            f"{_x(sp.speedup_e2e)} | {_x(sp.activation_at(1))} | {span} | "
            f"{_ms(sp.redundant_prefill_eliminated_ms)} |"
        )
    return [*lines, ""]


def _targets_section(targets: Sequence[Target]) -> list[str]:
    if not targets:
        return ["## Targets", "", "No targets were given for this run.", ""]
    lines = [
        "## Targets",
        "",
        "| target | measured | required | result | note |",
        "|---|--:|---|---|---|",
    ]
    for t in targets:
        value = "not measured" if t.status == "NOT MEASURED" else _with_unit(t.value, t.unit)
        result = t.status if t.passed else f"**{t.status}**"
        lines.append(
            f"| {_esc(t.name)} | {value} | {t.op} {_with_unit(t.threshold, t.unit)} "
            f"| {result} | {_esc(t.note)} |"
        )
    failed = sum(not t.passed for t in targets)
    return [*lines, "", f"{len(targets) - failed} of {len(targets)} targets met.", ""]


def _plots_section(plots: Sequence[Path], base: Path) -> list[str]:
    if not plots:
        return []
    lines = ["## Plots", ""]
    for p in plots:
        rel = Path(os.path.relpath(Path(p).resolve(), base.resolve())).as_posix()
        lines += [f"![{Path(p).stem}]({rel})", ""]
    return lines


def _med(stat: Stat | None) -> float | None:
    return stat.median if stat is not None else None


def _spread(stat: Stat | None) -> str:
    return "–" if stat is None else f"{stat.median:.1f} [{stat.min:.1f}–{stat.max:.1f}]"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _num(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _with_unit(value: float | None, unit: str) -> str:
    # Milliseconds always with one decimal (the protocol); other units with two.
    text = _ms(value) if unit == "ms" else ("–" if value is None else f"{value:.2f}")
    return f"{text} {unit}".strip()


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _esc(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")
