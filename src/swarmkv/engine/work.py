"""What the engine works on: documents being prefilled on their own sequence, and requests (one
branch each) waiting for their prefix, prefilling their prompt, or generating.

| holder   | sequence                        | cells                                          |
|----------|---------------------------------|------------------------------------------------|
| document | its own prefix sequence         | its tokens                                     |
| request  | seq_cp of its document's prefix | its prompt + n_predict (the prefix is shared)  |
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..llama.sampling import RowCallback, SamplerConfig, TokenCallback

if TYPE_CHECKING:
    from .sequence import BranchState


@dataclass(eq=False)
class Document:
    """A document decoded in chunks on seq_id; `done` tokens are in the cells (tokens before
    `done`'s initial value were restored, not decoded). A chunk never crosses a bound's end,
    so the sequence holds exactly each bound's `hi` tokens at some step (watermarks)."""

    name: str
    tokens: list[int]
    seq_id: int
    bounds: list[tuple[int, int]]
    done: int = 0
    on_progress: Callable[[int], None] | None = None  # after the chunk ending at hi
    error: BaseException | None = None
    decode_ns: int = 0
    logits_last: bool = False  # keep the logits of the last token (row: last_row)
    last_row: int = -1
    _next: int = 0  # index of the first bound not fully decoded

    @property
    def ready(self) -> bool:
        """Whether every token is in the cells."""
        return self.done >= len(self.tokens)

    @property
    def pending(self) -> bool:
        """Whether tokens are left to decode (and the document has not failed)."""
        return self.error is None and not self.ready

    def next_span(self, budget: int) -> tuple[int, int]:
        """The next tokens to decode, [lo, hi): within the current bound, at most budget."""
        while self._next < len(self.bounds) and self.bounds[self._next][1] <= self.done:
            self._next += 1
        end = self.bounds[self._next][1] if self._next < len(self.bounds) else len(self.tokens)
        return self.done, min(end, self.done + budget)

    def has(self, w: int) -> bool:
        """Whether the first w tokens are in the cells."""
        return self.error is None and self.done >= w


@dataclass(eq=False)
class Request:
    """One branch: a prompt continuing a prefix of `doc` (or, with doc None, a prefix already
    in seq_id's cells), then up to n_predict generated tokens.

    seq_id None: the engine takes a free sequence and shares the prefix to it at admission
    (seq_cp, zero copy). A given seq_id already holds the prefix (the caller shared it).
    """

    name: str
    prompt: list[int]
    n_predict: int
    sampler: SamplerConfig
    prefix_len: int
    doc: Document | None = None
    seq_id: int | None = None
    stop: tuple[str, ...] = ()
    on_token: TokenCallback | None = None
    keep_logits: bool | str = False
    priority: int = 0
    arrival_s: float = 0.0
    seq_no: int = 0
    on_finish: Callable[[Request], None] | None = None
    arrival_ns: int = field(default_factory=time.perf_counter_ns)
    state: BranchState | None = None
    prompt_done: int = 0
    admit_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    error: BaseException | None = None  # a failure before admission (its document's)
    own_seq: bool = False  # the engine took seq_id from its free list
    keep_cells: bool = False  # a finished request's cells stay (the server's prefix cache)
    on_row: RowCallback | None = None  # (logits row, sampled token): the server's logprobs

    @property
    def prompt_left(self) -> int:
        """Prompt tokens not yet decoded."""
        return len(self.prompt) - self.prompt_done

    @property
    def cells(self) -> int:
        """KV cells this request may fill beyond its shared prefix (forced tokens count
        toward n_predict)."""
        return len(self.prompt) + self.n_predict

    @property
    def generating(self) -> bool:
        """Whether its prompt is decoded and it has tokens to decode (its last sampled one, and
        any its grammar forced after it)."""
        st = self.state
        return st is not None and self.prompt_left == 0 and bool(st.pending) and not st.done

    def inter_token_ms(self) -> tuple[float, ...]:
        """Gaps between consecutive generated tokens (ms)."""
        return tuple((b - a) / 1e6 for a, b in itertools.pairwise(self.token_ns))


@dataclass
class SeqIds:
    """Cells and sequence ids of a context the engine hands out: documents take ids from
    [0, max_docs), requests from the rest, so n_seq - max_docs bounds the live requests."""

    n_ctx: int
    max_docs: int
    n_seq: int
    cells_used: int = 0

    def __post_init__(self) -> None:
        self.free = {
            "doc": list(range(self.max_docs)),
            "branch": list(range(self.max_docs, self.n_seq)),
        }

    def can_take(self, cells: int, kind: str = "branch") -> bool:
        """Whether a sequence id of kind and `cells` KV cells are free."""
        return bool(self.free[kind]) and self.cells_used + cells <= self.n_ctx

    def take(self, cells: int, kind: str = "branch") -> int:
        """A free sequence id of kind, with cells counted as used."""
        self.cells_used += cells
        return self.free[kind].pop(0)

    def give_back(self, seq_id: int, cells: int, kind: str = "branch") -> None:
        """Return a sequence id of kind and its cells."""
        self.cells_used -= cells
        self.free[kind].append(seq_id)
