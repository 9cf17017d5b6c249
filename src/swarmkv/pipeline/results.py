"""Result records of a pipeline run (pure data; JSON-ready via to_dict)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def ms(ns: int) -> float:
    """Nanoseconds as milliseconds, rounded to 3 decimals (microseconds)."""
    return round(ns / 1e6, 3)


@dataclass(frozen=True)
class BranchResult:
    """What one branch produced, and where its time went (milliseconds)."""

    name: str
    prompt: str
    text: str
    tokens: tuple[int, ...]
    stop_reason: str
    prefix_tokens: int
    prompt_tokens: int
    activation_ms: float  # from "may start" to its first generated token
    restore_ms: float | None  # host: llama_state_seq_set_data; fork: seq_cp; baseline: None
    fork_copy_ms: float | None  # host: copy-on-fork of the snapshot bytes
    prefill_ms: float | None  # baseline: this branch's own document prefill
    decode_ms: float  # prompt + generation
    first_token_ms: float  # from pipeline start to its first generated token
    end_ms: float  # from pipeline start to its last token
    wait_ms: float | None = None  # host: input ready, waiting for a context slot (policy)
    step_logits: tuple[np.ndarray, ...] = field(default=(), compare=False, repr=False)

    @property
    def first_logits(self) -> np.ndarray | None:
        """Logits of the first generated step (kept with keep_logits), or None."""
        return self.step_logits[0] if self.step_logits else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields of the result; step_logits are left out."""
        return {
            "name": self.name,
            "prompt": self.prompt,
            "text": self.text,
            "tokens": list(self.tokens),
            "stop_reason": self.stop_reason,
            "prefix_tokens": self.prefix_tokens,
            "prompt_tokens": self.prompt_tokens,
            "activation_ms": self.activation_ms,
            "restore_ms": self.restore_ms,
            "fork_copy_ms": self.fork_copy_ms,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "first_token_ms": self.first_token_ms,
            "end_ms": self.end_ms,
            "wait_ms": self.wait_ms,
        }


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
