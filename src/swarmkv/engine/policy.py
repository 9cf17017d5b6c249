"""Scheduling policies of the swarm: plain Python, no native calls, testable alone.

A policy decides two things each step, from what the scheduler tells it:

* `admit_order(waiting, now_s)`: in which order waiting branches get a sequence and KV cells
  (the scheduler admits from the front while both last);
* `prompt_shares(prefilling, budget, now_s)`: how many prompt tokens each admitted branch
  whose prompt is not fully decoded may put into this step's batch (the n_batch budget left
  after one token per generating branch).

| policy       | admission                         | prompt tokens per step                 |
|--------------|-----------------------------------|----------------------------------------|
| fifo         | arrival order                     | earliest arrival first, as many as fit |
| fair         | arrival order                     | an equal share each (round robin)      |
| priority     | priority + aging x seconds waited | highest effective priority first       |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import ConfigError


class Waiting(Protocol):
    """What a policy sees of a branch: arrival time (s), priority, prompt tokens left."""

    @property
    def arrival_s(self) -> float: ...

    @property
    def priority(self) -> int: ...

    @property
    def seq_no(self) -> int: ...

    @property
    def prompt_left(self) -> int: ...


class Policy(Protocol):
    """A scheduling policy (see the module table)."""

    name: str

    def admit_order(self, waiting: Sequence[Waiting], now_s: float) -> list[Waiting]: ...

    def prompt_shares(
        self, prefilling: Sequence[Waiting], budget: int, now_s: float
    ) -> list[tuple[Waiting, int]]: ...


def _greedy(order: Sequence[Waiting], budget: int) -> list[tuple[Waiting, int]]:
    out = []
    for w in order:
        if budget <= 0:
            break
        take = min(w.prompt_left, budget)
        out.append((w, take))
        budget -= take
    return out


@dataclass
class Fifo:
    """First come, first served: the earliest arrival's prompt fills the budget first."""

    name: str = "fifo"

    def admit_order(self, waiting: Sequence[Waiting], now_s: float) -> list[Waiting]:
        """Arrival order (submission order on ties)."""
        return sorted(waiting, key=lambda w: (w.arrival_s, w.seq_no))

    def prompt_shares(
        self, prefilling: Sequence[Waiting], budget: int, now_s: float
    ) -> list[tuple[Waiting, int]]:
        """Earliest arrival first, each as many tokens as the budget has left."""
        return _greedy(self.admit_order(prefilling, now_s), budget)


@dataclass
class FairShare:
    """Round-robin fair share: every prefilling branch gets an equal slice of the prompt
    budget each step, so a long prompt cannot hold back the short ones behind it."""

    name: str = "fair"
    _turn: int = 0

    def admit_order(self, waiting: Sequence[Waiting], now_s: float) -> list[Waiting]:
        """Arrival order (submission order on ties)."""
        return sorted(waiting, key=lambda w: (w.arrival_s, w.seq_no))

    def prompt_shares(
        self, prefilling: Sequence[Waiting], budget: int, now_s: float
    ) -> list[tuple[Waiting, int]]:
        """Water-filling: equal shares, a branch needing less than its share gives the rest
        back; the branch served first rotates each step (the round robin)."""
        order = self.admit_order(prefilling, now_s)
        if not order or budget <= 0:
            return []
        k = self._turn % len(order)
        order = order[k:] + order[:k]
        self._turn += 1
        give = dict.fromkeys(range(len(order)), 0)
        left = budget
        active = [i for i, w in enumerate(order) if w.prompt_left > 0]
        while left > 0 and active:
            share = max(1, left // len(active))
            for i in list(active):
                take = min(share, order[i].prompt_left - give[i], left)
                give[i] += take
                left -= take
                if give[i] >= order[i].prompt_left:
                    active.remove(i)
                if left == 0:
                    break
        return [(order[i], n) for i, n in give.items() if n > 0]


@dataclass
class PriorityAging:
    """Highest priority first; a waiting branch gains `aging_per_s` priority per second, so
    a low priority is served eventually (no starvation)."""

    aging_per_s: float = 1.0
    name: str = "priority"

    def __post_init__(self) -> None:
        if not self.aging_per_s >= 0:  # also refuses nan
            raise ConfigError(f"aging_per_s must be >= 0, got {self.aging_per_s}")

    def effective(self, w: Waiting, now_s: float) -> float:
        """The priority w competes with now."""
        return w.priority + self.aging_per_s * max(0.0, now_s - w.arrival_s)

    def admit_order(self, waiting: Sequence[Waiting], now_s: float) -> list[Waiting]:
        """Effective priority, highest first; then arrival order."""
        return sorted(waiting, key=lambda w: (-self.effective(w, now_s), w.arrival_s, w.seq_no))

    def prompt_shares(
        self, prefilling: Sequence[Waiting], budget: int, now_s: float
    ) -> list[tuple[Waiting, int]]:
        """Highest effective priority first, each as many tokens as the budget has left."""
        return _greedy(self.admit_order(prefilling, now_s), budget)


POLICIES = ("fifo", "fair", "priority")


def make_policy(name: str) -> Policy:
    """The policy of a name in POLICIES; ConfigError naming the choices otherwise."""
    if name == "fifo":
        return Fifo()
    if name == "fair":
        return FairShare()
    if name == "priority":
        return PriorityAging()
    raise ConfigError(f"unknown swarm policy {name!r}; choose one of {', '.join(POLICIES)}")
