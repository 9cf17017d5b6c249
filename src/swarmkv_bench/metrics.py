"""Medians and spread per (config, mode), and speedups against a reference mode.

Warm-up trials are left out of every statistic: they pay one-time costs (page faults, thread
pool start) that the protocol excludes.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .records import TrialRecord

log = logging.getLogger("swarmkv.bench")


def spread(values: Sequence[float]) -> list[float]:
    """[median, min, max] of values (the docs' `spread` figures read this)."""
    return [statistics.median(values), min(values), max(values)]


@dataclass(frozen=True)
class Stat:
    """Median and spread of one metric over trials (None / NaN values left out)."""

    median: float
    min: float
    max: float
    q1: float
    q3: float
    n: int

    @property
    def iqr(self) -> float:
        """Interquartile range, q3 minus q1, in the metric's own unit."""
        return self.q3 - self.q1

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat | None:
        """Median, min, max and quartiles of the finite values; None when none is left."""
        vals = [float(v) for v in values if v is not None and math.isfinite(v)]
        if not vals:
            return None
        arr = np.asarray(vals, dtype=np.float64)
        q1, med, q3 = np.percentile(arr, [25, 50, 75])
        return cls(float(med), float(arr.min()), float(arr.max()), float(q1), float(q3), len(vals))

    def to_dict(self) -> dict[str, float]:
        """JSON-ready fields, with the iqr added."""
        return asdict(self) | {"iqr": self.iqr}


@dataclass(frozen=True)
class ModeSummary:
    """One mode of one config over its measured trials; per-branch tuples by branch index."""

    config_id: str
    mode: str
    n_branches: int
    doc_tokens: int
    n_predict: int
    n_trials: int
    e2e_ms: Stat | None
    prefill_ms: Stat | None
    prefill_total_ms: Stat | None  # sum of per-branch prefills (baseline); None when not recorded
    restore_total_ms: Stat | None  # restore + fork copy, summed over branches
    decode_total_ms: Stat | None
    branch_activation_ms: tuple[Stat | None, ...]
    first_token_ms: tuple[Stat | None, ...]
    restore_ms: tuple[Stat | None, ...]
    decode_ms: tuple[Stat | None, ...]
    restore_all_ms: Stat | None  # every branch's restore, pooled
    tokens_per_s: Stat | None
    peak_rss_bytes: Stat | None
    snapshot_bytes: Stat | None
    kv_bytes: Stat | None
    fidelity_checked: int
    fidelity_ok: int
    fidelity_failed: int
    best_trial: int | None  # the trial with the lowest e2e_ms (an extra, never the headline)
    branch_names: tuple[str, ...] = ()

    def activation_median(self, i: int) -> float | None:
        """Median activation of branch i, in milliseconds (may start to first token); else None."""
        return _median_at(self.branch_activation_ms, i)

    def prefill_work_ms(self) -> float | None:
        """Prefill work per trial: per-branch sum when recorded, else the shared prefill."""
        if self.prefill_total_ms is not None:
            return self.prefill_total_ms.median
        return self.prefill_ms.median if self.prefill_ms is not None else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: each Stat as a dict, tuples as lists."""
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            if isinstance(value, Stat):
                out[key] = value.to_dict()
            elif isinstance(value, tuple):
                out[key] = [v.to_dict() if isinstance(v, Stat) else v for v in value]
            else:
                out[key] = value
        return out


@dataclass(frozen=True)
class Speedup:
    """`mode` against `baseline_mode` in one config: ratios of medians (>1 means faster)."""

    config_id: str
    mode: str
    baseline_mode: str
    speedup_e2e: float | None
    speedup_activation: tuple[float | None, ...]
    redundant_prefill_eliminated_ms: float | None

    def activation_at(self, i: int) -> float | None:
        """Activation speedup of branch i (reference median over this mode's); None if absent."""
        return self.speedup_activation[i] if i < len(self.speedup_activation) else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, speedup_activation as a list."""
        return asdict(self) | {"speedup_activation": list(self.speedup_activation)}


def summarize(
    records: Iterable[TrialRecord], *, include_warmup: bool = False
) -> dict[tuple[str, str], ModeSummary]:
    """Group by (config_id, mode), keeping first-appearance order, and summarize each group."""
    groups: dict[tuple[str, str], list[TrialRecord]] = {}
    for r in records:
        if r.is_warmup and not include_warmup:
            continue
        groups.setdefault((r.config_id, r.mode), []).append(r)
    return {key: _summarize_group(rs) for key, rs in groups.items()}


def _summarize_group(rs: Sequence[TrialRecord]) -> ModeSummary:
    first = rs[0]
    width = max(len(r.activation_ms) for r in rs)
    checked = [r.fidelity_ok for r in rs if r.fidelity_ok is not None]
    best = min(rs, key=lambda r: r.e2e_ms if math.isfinite(r.e2e_ms) else math.inf)
    return ModeSummary(
        config_id=first.config_id,
        mode=first.mode,
        n_branches=first.n_branches,
        doc_tokens=first.doc_tokens,
        n_predict=first.n_predict,
        n_trials=len(rs),
        e2e_ms=Stat.of(r.e2e_ms for r in rs),
        prefill_ms=Stat.of(r.prefill_ms for r in rs),
        prefill_total_ms=Stat.of(_sum(r.branch_prefill_ms) for r in rs),
        restore_total_ms=Stat.of(_sum(r.restore_ms + r.fork_copy_ms) for r in rs),
        decode_total_ms=Stat.of(_sum(r.decode_ms) for r in rs),
        branch_activation_ms=_per_branch(rs, lambda r: r.activation_ms, width),
        first_token_ms=_per_branch(rs, lambda r: r.first_token_ms, width),
        restore_ms=_per_branch(rs, lambda r: r.restore_ms, width),
        decode_ms=_per_branch(rs, lambda r: r.decode_ms, width),
        restore_all_ms=Stat.of(v for r in rs for v in r.restore_ms),
        tokens_per_s=Stat.of(r.tokens_per_s for r in rs),
        peak_rss_bytes=Stat.of(r.peak_rss_bytes for r in rs),
        snapshot_bytes=Stat.of(r.snapshot_bytes for r in rs),
        kv_bytes=Stat.of(r.kv_bytes for r in rs),
        fidelity_checked=len(checked),
        fidelity_ok=sum(checked),
        fidelity_failed=len(checked) - sum(checked),
        best_trial=best.trial if math.isfinite(best.e2e_ms) else None,
        branch_names=max((r.branch_names for r in rs), key=len),
    )


def speedups(
    summaries: dict[tuple[str, str], ModeSummary], baseline_mode: str = "baseline"
) -> list[Speedup]:
    """Every other mode of each config against that config's `baseline_mode`.

    A config without the reference mode yields nothing (logged), and a metric either side
    lacks yields None rather than a made-up ratio.
    """
    out: list[Speedup] = []
    for (config_id, mode), s in summaries.items():
        if mode == baseline_mode:
            continue
        base = summaries.get((config_id, baseline_mode))
        if base is None:
            log.warning(
                "config %s has no %r runs: no speedups for %s", config_id, baseline_mode, mode
            )
            continue
        width = max(len(base.branch_activation_ms), len(s.branch_activation_ms))
        out.append(
            Speedup(
                config_id=config_id,
                mode=mode,
                baseline_mode=baseline_mode,
                speedup_e2e=_ratio(_median(base.e2e_ms), _median(s.e2e_ms)),
                speedup_activation=tuple(
                    _ratio(base.activation_median(i), s.activation_median(i)) for i in range(width)
                ),
                redundant_prefill_eliminated_ms=_eliminated(base, s),
            )
        )
    return out


def _eliminated(base: ModeSummary, s: ModeSummary) -> float | None:
    """The reference's prefill work (one per branch) minus what `s` still spends."""
    if base.prefill_total_ms is not None:
        base_work: float | None = base.prefill_total_ms.median
    elif base.prefill_ms is not None:
        # Without per-branch numbers, the reference pays its (median) prefill once per branch.
        base_work = base.prefill_ms.median * base.n_branches
    else:
        base_work = None
    mine = s.prefill_work_ms()
    return None if base_work is None or mine is None else base_work - mine


def _per_branch(
    rs: Sequence[TrialRecord], get: Callable[[TrialRecord], Sequence[float | None]], width: int
) -> tuple[Stat | None, ...]:
    return tuple(Stat.of(get(r)[i] if i < len(get(r)) else None for r in rs) for i in range(width))


def _sum(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(sum(vals)) if vals else None


def _median(stat: Stat | None) -> float | None:
    return stat.median if stat is not None else None


def _median_at(stats: Sequence[Stat | None], i: int) -> float | None:
    return _median(stats[i]) if i < len(stats) else None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den
