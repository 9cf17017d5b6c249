"""The scheduler's records: a document being prefilled or live, a branch waiting or running.

Sequence ids and KV cells of the swarm's one context (unified KV cache):

| holder   | sequence                 | cells                                        |
|----------|--------------------------|----------------------------------------------|
| document | its own prefix sequence  | its tokens, for as long as the swarm lives   |
| branch   | seq_cp of its document's | its prompt + n_predict (the prefix is shared) |
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from ..decoding import BranchState
from ..sampling import SamplerConfig
from .handle import BranchHandle, SwarmBranchResult


@dataclass
class DocJob:
    """A document: its tokens, its prefix sequence, and how far its prefill has got."""

    name: str
    tokens: list[int]
    seq_id: int
    done_tokens: int = 0
    error: BaseException | None = None

    @property
    def ready(self) -> bool:
        """Whether every token is decoded (branches may fork it)."""
        return self.done_tokens == len(self.tokens)


@dataclass
class Branch:
    """A submitted branch; `state` exists once admitted (a sequence and cells given)."""

    seq_no: int
    name: str
    doc: str
    prompt: list[int]
    n_predict: int
    sampler: SamplerConfig
    stop: tuple[str, ...]
    priority: int
    arrival_s: float
    handle: BranchHandle
    arrival_ns: int = field(default_factory=time.perf_counter_ns)
    state: BranchState | None = None
    prompt_done: int = 0
    admit_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)

    @property
    def prompt_left(self) -> int:
        """Prompt tokens not yet decoded."""
        return len(self.prompt) - self.prompt_done

    @property
    def cells(self) -> int:
        """KV cells this branch may fill beyond its shared prefix."""
        return len(self.prompt) + self.n_predict

    def result(self) -> SwarmBranchResult:
        """The finished branch's output and latencies (ms from arrival)."""
        st = self.state
        assert st is not None and self.admit_ns is not None
        first, end = st.span_ns()
        gaps = tuple((b - a) / 1e6 for a, b in itertools.pairwise(self.token_ns))
        return SwarmBranchResult(
            name=self.name,
            doc=self.doc,
            text=st.text,
            tokens=tuple(st.tokens),
            stop_reason=st.stop_reason or "error",
            priority=self.priority,
            prompt_tokens=len(self.prompt),
            arrival_s=self.arrival_s,
            queue_ms=(self.admit_ns - self.arrival_ns) / 1e6,
            activation_ms=(first - self.arrival_ns) / 1e6,
            completion_ms=(end - self.arrival_ns) / 1e6,
            inter_token_ms=gaps,
        )
