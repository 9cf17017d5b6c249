"""Result records of a pipeline run (pure data; JSON-ready via to_dict); each branch's is the
engine's one BranchResult."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.result import BranchResult


@dataclass(frozen=True)
class NodeOutcome:
    """How one DAG node ended: ok, failed, skipped or cancelled, with reason and error."""

    name: str
    status: str  # ok | failed | skipped | cancelled
    reason: str | None = None
    error: BaseException | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PipelineResult:
    """Everything one Pipeline.run produced; times in milliseconds, sizes in bytes."""

    mode: str
    model: str
    prefix_tokens: int
    n_ctx: int
    prefill_ms: float
    snapshot_bytes: int
    e2e_ms: float
    branches: dict[str, BranchResult]
    outcomes: dict[str, NodeOutcome]
    kv_bytes: int | None = None  # resident KV cache bytes of the branch context(s)
    decode_stats: dict[str, float] = field(default_factory=dict)  # see engine.stats.DecodeStats
    reused_tokens: int = 0  # document tokens restored from a snapshot instead of prefilled
    dist: dict[str, Any] | None = None  # a Ray run's workers and timings (swarmkv.dist)
    exact: bool | None = None  # the kernels used: batch-invariant (True) or plain (False)

    @property
    def ok(self) -> bool:
        """Whether every node (document and branches) finished with status ok."""
        return all(o.status == "ok" for o in self.outcomes.values())

    def __getitem__(self, name: str) -> BranchResult:
        return self.branches[name]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; branches as a list, node outcomes without their exceptions."""
        return {
            "mode": self.mode,
            "exact": self.exact,
            "model": self.model,
            "prefix_tokens": self.prefix_tokens,
            "reused_tokens": self.reused_tokens,
            "n_ctx": self.n_ctx,
            "prefill_ms": self.prefill_ms,
            "snapshot_bytes": self.snapshot_bytes,
            "e2e_ms": self.e2e_ms,
            "kv_bytes": self.kv_bytes,
            "decode_stats": self.decode_stats,
            "branches": [b.to_dict() for b in self.branches.values()],
            "nodes": {
                n: {"status": o.status, "reason": o.reason} for n, o in self.outcomes.items()
            },
            **({"dist": self.dist} if self.dist is not None else {}),
        }
