"""Swarm policies and metrics, pure Python: admission order, prompt budget shares,
percentiles and Jain's index."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from swarmkv.engine.policy import FairShare, Fifo, PriorityAging, make_policy
from swarmkv.errors import ConfigError
from swarmkv.swarm.metrics import Percentiles, jain, percentile


@dataclass
class W:
    seq_no: int
    arrival_s: float
    priority: int = 0
    prompt_left: int = 100


def test_fifo_admits_and_fills_by_arrival() -> None:
    ws = [W(0, 2.0), W(1, 1.0, prompt_left=30), W(2, 3.0)]
    assert [w.seq_no for w in Fifo().admit_order(ws, 5.0)] == [1, 0, 2]
    assert [(w.seq_no, n) for w, n in Fifo().prompt_shares(ws, 100, 5.0)] == [(1, 30), (0, 70)]


def test_fair_share_splits_the_budget_equally_and_gives_back_what_is_not_needed() -> None:
    ws = [W(0, 0.0, prompt_left=500), W(1, 1.0, prompt_left=10), W(2, 2.0, prompt_left=500)]
    shares = {w.seq_no: n for w, n in FairShare().prompt_shares(ws, 300, 5.0)}
    assert shares[1] == 10  # needs less than its third: the rest goes to the others
    assert shares[0] + shares[2] == 290 and abs(shares[0] - shares[2]) <= 1
    assert sum(shares.values()) <= 300


def test_fair_share_rotates_who_is_served_first() -> None:
    policy = FairShare()
    ws = [W(i, float(i), prompt_left=50) for i in range(3)]
    firsts = [policy.prompt_shares(ws, 2, 0.0)[0][0].seq_no for _ in range(3)]
    assert sorted(firsts) == [0, 1, 2]  # 2 tokens for 3 branches: each turn someone else


def test_priority_ages_so_nobody_starves() -> None:
    """A low priority that has waited longer than the gap beats a newcomer of high priority
    (without aging, high priorities arriving forever would starve it)."""
    low, high = W(0, 0.0, priority=0), W(1, 15.0, priority=10)
    assert [w.seq_no for w in PriorityAging(0.0).admit_order([low, high], 16.0)] == [1, 0]
    assert [w.seq_no for w in PriorityAging(1.0).admit_order([low, high], 16.0)] == [0, 1]
    early = W(2, 15.0, priority=10)
    assert [w.seq_no for w in PriorityAging(1.0).admit_order([low, early], 9.0)] == [2, 0]


def test_policies_by_name_and_bad_settings() -> None:
    assert [make_policy(n).name for n in ("fifo", "fair", "priority")] == [
        "fifo",
        "fair",
        "priority",
    ]
    with pytest.raises(ConfigError, match="unknown swarm policy 'lifo'"):
        make_policy("lifo")
    with pytest.raises(ConfigError, match="aging_per_s"):
        PriorityAging(aging_per_s=math.nan)


def test_percentiles_and_jain() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert Percentiles.of([]).p50 != Percentiles.of([]).p50  # nan for nothing measured
    assert jain([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
