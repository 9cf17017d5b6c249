"""Fidelity: does a branch answer what a fresh context answers? (see shared measuring.md)

Pure numpy; used by the tests and by the benchmark on every trial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NMSE_LIMIT = 1e-5  # llama.cpp's own save/load criterion


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    """sum((a-b)^2) / sum(b^2), with b the reference."""
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(((a64 - b64) ** 2).sum() / (b64**2).sum())


def top2_margin(logits: np.ndarray) -> float:
    """Top-1 minus top-2 logit (in float64); 0 when the two largest tie."""
    top = np.partition(np.asarray(logits, dtype=np.float64), -2)[-2:]
    return float(top[1] - top[0])


@dataclass(frozen=True)
class Fidelity:
    """How a branch's output compares with the baseline's for the same branch."""

    tokens_equal: bool
    n_compared: int
    first_nmse: float | None
    diverged_at: int | None = None
    margin: float | None = None  # baseline top-1 minus top-2 logit at the divergence
    max_abs_diff: float | None = None  # largest |logit difference| there
    note: str = ""

    @property
    def near_tie(self) -> bool:
        """A divergence the numerics explain: the gap was smaller than the logit noise."""
        return (
            self.diverged_at is not None
            and self.margin is not None
            and self.max_abs_diff is not None
            and self.margin < self.max_abs_diff
        )

    @property
    def ok(self) -> bool:
        """Whether the tokens match, or the divergence is a near-tie."""
        return self.tokens_equal or self.near_tie

    def describe(self) -> str:
        """One line for reports: tokens equal and first-step NMSE, else the divergence verdict."""
        if self.tokens_equal:
            return f"{self.n_compared} tokens equal, first-step NMSE {_num(self.first_nmse)}"
        verdict = "near-tie" if self.near_tie else "NOT a near-tie: bug"
        return (
            f"diverged at step {self.diverged_at}: baseline top-2 margin {_num(self.margin)} "
            f"vs max |logit diff| {_num(self.max_abs_diff)} ({verdict}) {self.note}"
        ).rstrip()


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def compare(
    tokens: Sequence[int],
    base_tokens: Sequence[int],
    logits: Sequence[np.ndarray] | None = None,
    base_logits: Sequence[np.ndarray] | None = None,
) -> Fidelity:
    """Token equality; at a divergence, the near-tie test (needs both runs' step logits)."""
    n = min(len(tokens), len(base_tokens))
    first = nmse(logits[0], base_logits[0]) if logits and base_logits else None
    k = next((i for i in range(n) if tokens[i] != base_tokens[i]), None)
    if k is None and len(tokens) == len(base_tokens):
        return Fidelity(True, n, first)
    if k is None:  # one stopped earlier (end of generation) with the same prefix
        k = n
    if logits is None or base_logits is None or k >= min(len(logits), len(base_logits)):
        return Fidelity(False, n, first, k, note="no step logits to judge the divergence")
    return Fidelity(
        False,
        n,
        first,
        k,
        top2_margin(base_logits[k]),
        float(np.abs(np.asarray(logits[k]) - np.asarray(base_logits[k])).max()),
    )
