"""SwarmStats: what a swarm run measured, as latency percentiles, fairness and throughput."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.result import BranchResult
from .metrics import Percentiles, jain

AloneMs = Callable[[BranchResult], float]


def per_token_ms(r: BranchResult) -> float:
    """The default slowdown basis: completion time per generated token (service rate)."""
    return r.completion_ms / max(len(r.tokens), 1)


@dataclass(frozen=True)
class SwarmStats:
    """Over the finished branches: p50/p95/p99 of queue wait, activation (arrival to first
    token), inter-token gap and completion; Jain's fairness index of each branch's slowdown
    (completion over its time alone, or per generated token when that is not known);
    aggregate generated tokens per second of wall time."""

    n_branches: int
    tokens: int
    wall_s: float
    steps: int
    decode_ms: float
    queue_ms: Percentiles
    activation_ms: Percentiles
    inter_token_ms: Percentiles
    completion_ms: Percentiles
    fairness: float

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of wall time."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @staticmethod
    def of(
        results: Sequence[BranchResult],
        tokens: int,
        wall_s: float,
        steps: int = 0,
        decode_ms: float = 0.0,
        alone_ms: AloneMs | None = None,
    ) -> SwarmStats:
        """Stats of results; alone_ms(r) is r's time alone, for the slowdown's fairness."""
        if alone_ms is None:
            slowdowns = [per_token_ms(r) for r in results]
        else:
            slowdowns = [r.completion_ms / max(alone_ms(r), 1e-9) for r in results]
        return SwarmStats(
            n_branches=len(results),
            tokens=tokens,
            wall_s=wall_s,
            steps=steps,
            decode_ms=decode_ms,
            queue_ms=Percentiles.of([r.queue_ms for r in results]),
            activation_ms=Percentiles.of([r.activation_ms for r in results]),
            inter_token_ms=Percentiles.of([g for r in results for g in r.inter_token_ms]),
            completion_ms=Percentiles.of([r.completion_ms for r in results]),
            fairness=jain(slowdowns),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "n_branches": self.n_branches,
            "tokens": self.tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "steps": self.steps,
            "decode_ms": self.decode_ms,
            "queue_ms": self.queue_ms.to_dict(),
            "activation_ms": self.activation_ms.to_dict(),
            "inter_token_ms": self.inter_token_ms.to_dict(),
            "completion_ms": self.completion_ms.to_dict(),
            "fairness": self.fairness,
        }
