"""The one concurrency policy: who may touch which llama object, and how many run at once.

llama.cpp allows one context per thread sharing one model; a context and each sampler must be
used by one thread at a time. SwarmKV guarantees that structurally: every host or baseline
context is created, used and freed inside one DAG node, the fork mode's shared context lives
in the caller's thread (one engine), the swarm's on its one worker thread, and every sampler
belongs to one branch. What is left to decide is how many branch contexts may exist and
decode at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import ConfigError

# host mode's own choice (max_contexts=None): at most this many branch contexts at once
AUTO_MAX_CONTEXTS = 4


@dataclass(frozen=True)
class Slots:
    """One run's branch-context slots: how many contexts may exist at once, and the threads
    each gets (None: the pipeline's own count)."""

    count: int
    threads: int | None
    _sem: threading.BoundedSemaphore = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_sem", threading.BoundedSemaphore(self.count))

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold one slot for the with-block; blocks while all are taken."""
        with self._sem:
            yield

    def overrides(self) -> dict[str, int]:
        """ContextConfig fields a branch context of this run takes (its threads)."""
        return {} if self.threads is None else {"n_threads": self.threads}


@dataclass(frozen=True)
class ConcurrencyPolicy:
    """How many host or baseline branch contexts exist and decode at once.

    max_contexts=None (the default) lets each mode choose. The baseline keeps one context at
    a time with every core: its branches are prefills, which use every core already, and one
    at a time gives each branch its fastest service. Host mode decodes up to min(threads,
    branches, AUTO_MAX_CONTEXTS) branch contexts at once, the cores split among them (2 cores:
    two branch contexts of 1 thread each): a branch there is a restore and a short decode, one
    row a step, which leaves cores waiting on memory when it runs alone (measured on 2 cores:
    the two branches of the paper configuration in 613 ms at once against 830 one after the
    other). A number sets every mode's count, each context keeping the pipeline's threads
    (with a GPU, or with few threads per context).
    """

    max_contexts: int | None = None

    def __post_init__(self) -> None:
        if self.max_contexts is not None and self.max_contexts < 1:
            raise ConfigError(f"max_contexts must be >= 1, got {self.max_contexts}")

    def slots(self, n_threads: int, n_branches: int, split: bool) -> Slots:
        """One run's slots: the number given, or the mode's own choice (split: host's)."""
        if self.max_contexts is not None:
            return Slots(self.max_contexts, None)
        if not split:
            return Slots(1, None)
        count = max(1, min(n_threads, n_branches, AUTO_MAX_CONTEXTS))
        return Slots(count, max(1, n_threads // count) if count > 1 else None)
