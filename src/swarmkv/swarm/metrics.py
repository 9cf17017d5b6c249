"""Latency percentiles and Jain's fairness index over a swarm's finished branches (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's
    default); nan for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one has all."""
    if not values:
        return math.nan
    sq = sum(x * x for x in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq > 0 else 1.0


@dataclass(frozen=True)
class Percentiles:
    """p50/p95/p99 and max of one latency, in milliseconds."""

    p50: float
    p95: float
    p99: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Percentiles:
        """The percentiles of values (nan for none)."""
        return Percentiles(
            percentile(values, 50),
            percentile(values, 95),
            percentile(values, 99),
            max(values) if values else math.nan,
        )

    def to_dict(self) -> dict[str, float]:
        """JSON-ready fields."""
        return {"p50": self.p50, "p95": self.p95, "p99": self.p99, "max": self.max}
