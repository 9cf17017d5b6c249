"""Summaries and speedups on hand-made numbers, checked by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from swarmkv_bench.metrics import Stat, speedups, summarize
from swarmkv_bench.records import TrialRecord


def rec(mode: str, trial: int, e2e: float, act: tuple[float, ...], **kw: Any) -> TrialRecord:
    base: dict[str, Any] = {
        "config_id": kw.pop("config_id", "N2"),
        "n_branches": len(act),
        "doc_tokens": 3501,
        "n_predict": 32,
        "mode": mode,
        "trial": trial,
        "e2e_ms": e2e,
        "activation_ms": act,
        "decode_ms": (10.0,) * len(act),
        "tokens_generated": 64,
    }
    return TrialRecord(**(base | kw))


def paired_records() -> list[TrialRecord]:
    """Warm-up (trial 0, wild numbers that must not count), then three alternating trials."""
    return [
        rec("baseline", 0, 999.0, (999.0, 999.0), is_warmup=True, prefill_ms=99.0),
        rec("fork", 0, 999.0, (999.0, 999.0), is_warmup=True, prefill_ms=99.0),
        rec("baseline", 1, 100.0, (30.0, 60.0), prefill_ms=25.0, branch_prefill_ms=(25.0, 25.0)),
        rec("fork", 1, 40.0, (2.0, 4.0), prefill_ms=24.0, restore_ms=(0.4, 0.6), fidelity_ok=True),
        rec("baseline", 2, 110.0, (32.0, 64.0), prefill_ms=26.0, branch_prefill_ms=(26.0, 26.0)),
        rec("fork", 2, 50.0, (3.0, 5.0), prefill_ms=26.0, restore_ms=(0.5, 0.5), fidelity_ok=False),
        rec("baseline", 3, 130.0, (34.0, 62.0), prefill_ms=27.0, branch_prefill_ms=(27.0, 27.0)),
        rec("fork", 3, 45.0, (4.0, 6.0), prefill_ms=25.0, restore_ms=(0.6, 0.4), fidelity_ok=True),
    ]


def test_stat_median_range_and_iqr() -> None:
    s = Stat.of([130.0, 100.0, 110.0])
    assert s is not None
    assert (s.median, s.min, s.max, s.n) == (110.0, 100.0, 130.0, 3)
    assert (s.q1, s.q3, s.iqr) == (105.0, 120.0, 15.0)  # numpy's linear percentiles


def test_stat_skips_missing_values_and_is_none_when_nothing_is_left() -> None:
    s = Stat.of([None, math.nan, 4.0, 2.0])
    assert s is not None and (s.median, s.n) == (3.0, 2)
    assert Stat.of([]) is None
    assert Stat.of([None, math.nan]) is None


def test_summaries_exclude_warmups_and_give_medians_and_spread() -> None:
    sums = summarize(paired_records())
    assert list(sums) == [("N2", "baseline"), ("N2", "fork")]
    base, fork = sums["N2", "baseline"], sums["N2", "fork"]
    assert base.n_trials == 3 and fork.n_trials == 3
    assert base.e2e_ms is not None and fork.e2e_ms is not None
    assert (base.e2e_ms.median, base.e2e_ms.min, base.e2e_ms.max) == (110.0, 100.0, 130.0)
    assert (fork.e2e_ms.median, fork.e2e_ms.q1, fork.e2e_ms.q3) == (45.0, 42.5, 47.5)
    assert base.activation_median(0) == 32.0 and base.activation_median(1) == 62.0
    assert fork.activation_median(0) == 3.0 and fork.activation_median(1) == 5.0
    assert fork.activation_median(2) is None
    assert base.prefill_total_ms is not None and base.prefill_total_ms.median == 52.0
    assert fork.prefill_total_ms is None
    assert fork.restore_all_ms is not None and fork.restore_all_ms.median == 0.5
    assert fork.restore_total_ms is not None and fork.restore_total_ms.median == 1.0
    assert fork.decode_total_ms is not None and fork.decode_total_ms.median == 20.0
    # 64 tokens over 45 ms is 1422.2 tokens/s.
    assert fork.tokens_per_s is not None
    assert fork.tokens_per_s.median == pytest.approx(64 / 0.045)
    assert base.best_trial == 1 and fork.best_trial == 1


def test_fidelity_counts_per_mode() -> None:
    sums = summarize(paired_records())
    fork = sums["N2", "fork"]
    assert (fork.fidelity_checked, fork.fidelity_ok, fork.fidelity_failed) == (3, 2, 1)
    assert sums["N2", "baseline"].fidelity_checked == 0


def test_warmups_can_be_included_on_request() -> None:
    sums = summarize(paired_records(), include_warmup=True)
    assert sums["N2", "fork"].n_trials == 4


def test_speedups_are_ratios_of_medians() -> None:
    (sp,) = speedups(summarize(paired_records()))
    assert (sp.config_id, sp.mode, sp.baseline_mode) == ("N2", "fork", "baseline")
    assert sp.speedup_e2e == pytest.approx(110.0 / 45.0)
    assert sp.speedup_activation == pytest.approx((32.0 / 3.0, 62.0 / 5.0))
    assert sp.activation_at(1) == pytest.approx(12.4)
    assert sp.activation_at(5) is None
    # Baseline: 26 + 26 ms of prefill per trial (median); fork: one 25 ms prefill.
    assert sp.redundant_prefill_eliminated_ms == pytest.approx(52.0 - 25.0)


def test_eliminated_prefill_without_per_branch_numbers_uses_median_times_n() -> None:
    rs = [
        rec("baseline", 1, 100.0, (30.0, 60.0), prefill_ms=20.0),
        rec("baseline", 2, 100.0, (30.0, 60.0), prefill_ms=30.0),
        rec("baseline", 3, 100.0, (30.0, 60.0), prefill_ms=40.0),
        rec("fork", 1, 50.0, (3.0, 5.0), prefill_ms=31.0),
    ]
    (sp,) = speedups(summarize(rs))
    assert sp.redundant_prefill_eliminated_ms == pytest.approx(30.0 * 2 - 31.0)


def test_missing_modes_and_metrics_give_none_not_errors() -> None:
    rs = [
        rec("fork", 1, 50.0, (3.0, 5.0), config_id="no-baseline"),
        rec("baseline", 1, 100.0, (30.0, 60.0), config_id="N2", prefill_ms=25.0),
        # A peer: no observable prefill, and activation for one branch only.
        rec("server-np1", 1, 80.0, (20.0,), config_id="N2"),
    ]
    sps = speedups(summarize(rs))
    assert [(s.config_id, s.mode) for s in sps] == [("N2", "server-np1")]
    (sp,) = sps
    assert sp.speedup_e2e == pytest.approx(100.0 / 80.0)
    assert sp.speedup_activation == pytest.approx((1.5, None))
    assert sp.redundant_prefill_eliminated_ms is None
    assert speedups({}) == []
    assert speedups(summarize(rs), baseline_mode="nope") == []


def test_speedups_against_a_peer_reference() -> None:
    rs = [
        rec("server-npN", 1, 80.0, (20.0, 40.0)),
        rec("fork", 1, 40.0, (2.0, 4.0), prefill_ms=24.0),
    ]
    (sp,) = speedups(summarize(rs), baseline_mode="server-npN")
    assert sp.baseline_mode == "server-npN" and sp.speedup_e2e == pytest.approx(2.0)
    assert sp.speedup_activation == pytest.approx((10.0, 10.0))


def test_summary_to_dict_uses_metric_names() -> None:
    d = summarize(paired_records())["N2", "fork"].to_dict()
    assert d["e2e_ms"]["median"] == 45.0 and d["e2e_ms"]["iqr"] == 5.0
    assert d["branch_activation_ms"][1]["median"] == 5.0
    assert d["prefill_total_ms"] is None


def test_proc_status_reader() -> None:
    from swarmkv_bench.sysinfo import proc_status_bytes, rss_bytes

    rss = proc_status_bytes("VmRSS")
    assert rss is not None and rss > 1 << 20 and rss_bytes() > 1 << 20
    assert proc_status_bytes("NoSuchField") is None
    assert proc_status_bytes("VmRSS", pid=2**31 - 1) is None  # no such process
