"""The arrivals of `swarmkv bench --swarm`: a seeded Poisson process of agents, the replay
that hands each one to a system at its time, and what a system made of them (`SystemRun`).
Every system (swarm, host lock, llama-server peers) is fed by the same `replay`, so they all
see the same arrivals the same way."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarmkv.engine.result import BranchResult


@dataclass(frozen=True)
class Arrival:
    """One agent: when it arrives (seconds from the start), what it asks, how long."""

    index: int
    t_s: float
    prompt: str
    n_predict: int
    priority: int

    @property
    def name(self) -> str:
        """The branch name every system gives this agent's result."""
        return f"a{self.index}"


def poisson_arrivals(rate: float, count: int, n_min: int, n_max: int, seed: int) -> list[Arrival]:
    """count arrivals with exponential gaps of mean 1/rate seconds (a Poisson process)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(count):
        t += rng.expovariate(rate)
        prompt = (
            f"\n\nAgent {i}, question {rng.randint(1, 999)}: what does the text say next?\nAnswer:"
        )
        out.append(Arrival(i, t, prompt, rng.randint(n_min, n_max), rng.randint(0, 2)))
    return out


def replay(arrivals: Sequence[Arrival], submit: Callable[[Arrival], object]) -> None:
    """Call submit(a) for each arrival at its time (relative to now)."""
    t0 = time.perf_counter()
    for a in arrivals:
        delay = t0 + a.t_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        submit(a)


@dataclass(frozen=True)
class SystemRun:
    """One system's run of the arrivals: a result per arrival (in arrival order), the wall
    time from the first release to the last token, and what only this system reports (the
    peers' server counters; empty for the others)."""

    results: list[BranchResult]
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)
