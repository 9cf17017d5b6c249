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


@dataclass(frozen=True)
class ConcurrencyPolicy:
    """At most `max_contexts` host-mode branch contexts exist at once.

    The default of 1 suits a CPU: each context already uses every core (n_threads), so two
    decoding at once only contend; the branch DAG still runs, one branch context at a time.
    With a GPU, or with few threads per context, raise it.
    """

    max_contexts: int = 1
    _slots: threading.BoundedSemaphore = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_contexts < 1:
            raise ConfigError(f"max_contexts must be >= 1, got {self.max_contexts}")
        object.__setattr__(self, "_slots", threading.BoundedSemaphore(self.max_contexts))

    @contextmanager
    def context_slot(self) -> Iterator[None]:
        """Hold one of max_contexts slots for the with-block; blocks while all are taken."""
        with self._slots:
            yield
