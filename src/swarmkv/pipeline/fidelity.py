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


NEAR_TIE_SIGMAS = 4.0  # measuring.md: margin below 4 standard deviations of the differences


@dataclass(frozen=True)
class Fidelity:
    """How a branch's output compares with the baseline's for the same branch.

    The judge (measuring.md): with exact=True any difference in tokens or kept logits is a
    failure. Otherwise a divergence is a near-tie only when both hold: replaying the branch
    alone with the baseline's batch shapes reproduced the baseline's tokens (replay_equal),
    and the baseline's top-2 margin at that step is below NEAR_TIE_SIGMAS standard deviations
    of the two runs' logit differences there. Anything else is a bug.
    """

    tokens_equal: bool
    n_compared: int
    first_nmse: float | None
    diverged_at: int | None = None
    margin: float | None = None  # baseline top-1 minus top-2 logit at the divergence
    diff_std: float | None = None  # std of the logit differences over the vocabulary there
    replay_equal: bool | None = None  # None: no replay was run
    logits_equal: bool | None = None  # every kept step's logits identical; None: none kept
    exact: bool = False
    note: str = ""
    pair: tuple[int | None, int | None] | None = None  # (ours, baseline's) token there; None: end

    @property
    def near_tie(self) -> bool:
        """A divergence the batch shapes explain, proven by a replay and a small margin."""
        return (
            not self.exact
            and self.diverged_at is not None
            and self.replay_equal is True
            and self.margin is not None
            and self.diff_std is not None
            and self.margin < NEAR_TIE_SIGMAS * self.diff_std
        )

    @property
    def ok(self) -> bool:
        """Exact: tokens and kept logits identical. Otherwise: tokens equal or a near-tie."""
        if self.exact:
            return self.tokens_equal and self.logits_equal is not False
        return self.tokens_equal or self.near_tie

    def describe(self) -> str:
        """One line for every report: the verdict, the step-0 NMSE, and at a divergence the
        margin, the noise and the replay, so a near-tie is never hidden behind a pass."""
        nmse_text = f"first-step NMSE {_num(self.first_nmse)}"
        if self.tokens_equal:
            # only a mode that claims exactness fails on logits; others report the NMSE above
            failed = self.exact and self.logits_equal is False
            same = "; logits differ (exact: failure)" if failed else ""
            return f"{self.n_compared} tokens equal, {nmse_text}{same}"
        got, want = self.pair or (None, None)
        ids = f" (got {_tok(got)}, baseline {_tok(want)})"
        head = f"diverged at step {self.diverged_at} of {self.n_compared}{ids}, {nmse_text}"
        if self.margin is None:
            return f"{head}: {self.note or 'no step logits'}; counted as a mismatch"
        replay = {None: "no replay", True: "replay matches", False: "replay differs"}
        if self.exact:
            verdict = "exact mode: failure"
        else:
            verdict = "near-tie" if self.near_tie else "NOT a near-tie: bug"
        return (
            f"{head}: baseline top-2 margin {_num(self.margin)} vs {NEAR_TIE_SIGMAS:g} sd "
            f"{_num(NEAR_TIE_SIGMAS * (self.diff_std or 0.0))}, "
            f"{replay[self.replay_equal]} ({verdict}) {self.note}"
        ).rstrip()


def _tok(t: int | None) -> str:
    return "end" if t is None else str(t)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def compare(
    tokens: Sequence[int],
    base_tokens: Sequence[int],
    logits: Sequence[np.ndarray] | None = None,
    base_logits: Sequence[np.ndarray] | None = None,
    *,
    replay_tokens: Sequence[int] | None = None,
    exact: bool = False,
) -> Fidelity:
    """Judge a branch against the baseline's same branch (see Fidelity for the rule).

    logits/base_logits: the step logits both runs kept (keep_logits="all"), needed to judge a
    divergence and to check exactness past step 0. replay_tokens: the branch's tokens when
    replayed alone with the baseline's batch shapes on the same shared KV state (host mode
    does exactly that); without it no divergence can be a near-tie.
    """
    n = min(len(tokens), len(base_tokens))
    both = bool(logits) and bool(base_logits)
    first = nmse(logits[0], base_logits[0]) if both else None  # type: ignore[index]
    same_logits = _all_equal(logits, base_logits) if both else None
    k = next((i for i in range(n) if tokens[i] != base_tokens[i]), None)
    if k is None and len(tokens) == len(base_tokens):
        return Fidelity(True, n, first, logits_equal=same_logits, exact=exact)
    if k is None:  # one stopped earlier (end of generation) with the same prefix
        k = n
    replay = None if replay_tokens is None else list(replay_tokens) == list(base_tokens)
    pair = (_at(tokens, k), _at(base_tokens, k))
    if not both or k >= min(len(logits), len(base_logits)):  # type: ignore[arg-type]
        note = "no step logits to judge the divergence"
        return Fidelity(False, n, first, k, replay_equal=replay, exact=exact, note=note, pair=pair)
    mine, base = np.asarray(logits[k], np.float64), np.asarray(base_logits[k], np.float64)  # type: ignore[index]
    return Fidelity(
        False,
        n,
        first,
        k,
        margin=top2_margin(base),
        diff_std=float(np.std(mine - base)),
        replay_equal=replay,
        logits_equal=False,
        exact=exact,
        pair=pair,
    )


def _at(tokens: Sequence[int], k: int) -> int | None:
    return int(tokens[k]) if k < len(tokens) else None


def _all_equal(a: Sequence[np.ndarray] | None, b: Sequence[np.ndarray] | None) -> bool:
    assert a is not None and b is not None
    n = min(len(a), len(b))
    return all(np.array_equal(a[i], b[i]) for i in range(n))
