"""The server's KV cache: which sequences are resident, who may share what, and eviction.

Plain Python over a context's seq_cp/seq_rm (any object with those two methods, so the
accounting is unit-tested without llama.cpp). Called on the engine thread only.

| sequence | holds                                     | leaves the cache                     |
|----------|-------------------------------------------|--------------------------------------|
| pinned   | a `--snapshot` file's tokens              | never                                |
| live     | its shared prefix + its own prompt (+ gen)| when it ends: kept idle, or freed    |
| idle     | a finished request's prompt + its output  | least recently used first, when a    |
|          |                                           | sequence id or cells run short       |

Cells in use are the tree's tokens (each shared run counted once) plus the generation room
reserved for every live request.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from .prefix_tree import Match, PrefixTree


class Decoding(Protocol):
    """What the cache reads of a live request: its prefix and prompt progress."""

    prefix_len: int
    prompt_done: int


@dataclass(frozen=True)
class Plan:
    """Where a request starts: `length` tokens shared from seq `source` (None: nothing),
    `ready` once those cells are decoded."""

    length: int
    source: int | None
    ready: bool


class PrefixCache:
    """Sequence ids [0, n_seq) and n_ctx cells of one unified KV cache (module table)."""

    def __init__(self, ctx: Any, n_ctx: int, n_seq: int, max_live: int) -> None:
        self.ctx = ctx
        self.n_ctx = n_ctx
        self.max_live = max_live
        self.tree = PrefixTree()
        self.free = list(range(n_seq))
        self.idle: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.pinned: set[int] = set()
        self.live: dict[int, int] = {}  # seq -> generation cells reserved
        self.writers: dict[int, Decoding] = {}  # request id -> the live request writing
        # cells a sequence decoded although the tree had those tokens already (a prompt's
        # last token, an output another request also gave): counted apart, as llama.cpp
        # holds them twice
        self.dups: dict[int, int] = {}
        self._sharing: dict[int, int] = {}  # seq -> tokens seq_cp gave it, until inserted
        self.reused_tokens = 0
        self.computed_tokens = 0
        self.evictions = 0
        self._pin_ids = itertools.count(-2, -1)  # writer ids of pinned runs: never live

    @property
    def cells_used(self) -> int:
        """Cells resident sequences hold, plus the generation room live requests reserve."""
        return self.tree.cells + sum(self.live.values()) + sum(self.dups.values())

    @property
    def pinned_cells(self) -> int:
        """Cells only pinned sequences hold: never freed."""
        return sum(len(n.tokens) for n in self.tree.runs() if n.holders <= self.pinned)

    # -- where a request starts ---------------------------------------------------------------
    def plan(self, tokens: list[int], scope: str | None) -> Plan:
        """The longest resident prefix of tokens that scope may read, leaving the last token
        to decode (its logits are the first sample)."""
        m = self.tree.match(tokens, scope, limit=len(tokens) - 1)
        if m.node is None or m.length == 0:
            return Plan(0, None, True)
        return Plan(m.length, self._source(m), self._ready(m))

    def _source(self, m: Match) -> int:
        # any holder holds those cells; prefer a finished one (it stays put)
        settled = sorted(s for s in m.holders if s not in self.live)
        return settled[0] if settled else min(m.holders)

    def _ready(self, m: Match) -> bool:
        assert m.node is not None
        writer = self.writers.get(m.node.writer)
        return writer is None or writer.prefix_len + writer.prompt_done >= m.length

    # -- admission and retirement -------------------------------------------------------------
    def new_cells(self, tokens: list[int], plan: Plan, max_tokens: int) -> int:
        """Cells a request would add: its unshared prompt and its generation room."""
        return len(tokens) - plan.length + max_tokens

    def admit(
        self,
        tokens: list[int],
        plan: Plan,
        max_tokens: int,
        scope: str | None,
        writer: int,
        req: Decoding,
    ) -> int | None:
        """A sequence holding plan's prefix (seq_cp, zero copy) for a request, its cells
        counted; None when a live slot, a sequence id or cells are short even after
        evicting idle sequences (least recently used first). When evicting every other
        idle sequence is not enough and plan's source is idle, the request takes the source
        over: its cells past the shared prefix go, the prefix stays (nothing recomputed)."""
        if len(self.live) >= self.max_live:
            return None
        need = self.new_cells(tokens, plan, max_tokens)
        if self._make_room(need, keep=plan.source):
            seq = self._copy_prefix(plan)
        elif self._can_take_over(plan, need):
            seq = self._take_over(plan)
        else:
            return None
        self._insert(seq, tokens, scope, writer)
        self.live[seq] = max_tokens
        self.writers[writer] = req
        self.reused_tokens += plan.length
        self.computed_tokens += len(tokens) - plan.length
        return seq

    def _make_room(self, need: int, keep: int | None) -> bool:
        """Evict idle sequences other than keep, least recently used first, until a sequence
        id and need cells are free; False when they run out first."""
        while not self.free or self.cells_used + need > self.n_ctx:
            if not self._evict_one(keep):
                return False
        return True

    def _copy_prefix(self, plan: Plan) -> int:
        """A free sequence given plan's prefix (seq_cp: the cells are shared, not copied)."""
        seq = self.free.pop(0)
        self._sharing[seq] = plan.length
        if plan.length:
            assert plan.source is not None
            self.ctx.seq_cp(plan.source, seq, 0, plan.length)
            if plan.source in self.idle:
                self.idle.move_to_end(plan.source)
        return seq

    def _can_take_over(self, plan: Plan, need: int) -> bool:
        """Whether plan's source is idle and, cut to plan's prefix, leaves room for need."""
        src = plan.source
        if src is None or src not in self.idle:
            return False
        return self.cells_used - self.tree.freed_by_truncate(src, plan.length) + need <= self.n_ctx

    def _take_over(self, plan: Plan) -> int:
        """plan's idle source, cut to plan's prefix, as the new request's sequence. Its
        duplicate cells stay counted (they may lie in the prefix): an overcount, gone when
        the sequence is dropped."""
        src = plan.source
        assert src is not None
        self.idle.pop(src)
        self.tree.truncate(src, plan.length)
        self.ctx.seq_rm(src, plan.length, None)
        self.evictions += 1
        return src

    def _evict_one(self, keep: int | None) -> bool:
        victim = next((s for s in self.idle if s != keep), None)
        if victim is None:
            return False
        self.drop(victim)
        self.evictions += 1
        return True

    def retire(self, seq: int, writer: int, decoded: list[int] | None, scope: str | None) -> None:
        """A live request ended. decoded: every token its cells now hold (kept idle for
        the next request to share); None: it failed or was cancelled, and the engine has
        removed its cells (seq_rm), so the sequence is forgotten."""
        self.live.pop(seq, None)
        self.writers.pop(writer, None)
        if decoded is None:
            self.tree.remove(seq)
            self.dups.pop(seq, None)
            self.free.append(seq)
            return
        self._insert(seq, decoded, scope, writer)
        self.idle[seq] = None

    def _insert(self, seq: int, tokens: list[int], scope: str | None, writer: int) -> None:
        # tokens seq held before: its path in the tree, or (first insert) what seq_cp gave it
        shared = self.tree.holds(seq) or self._sharing.pop(seq, 0)
        new = self.tree.insert(seq, tokens, scope, writer)
        dup = len(tokens) - shared - new
        if dup:
            self.dups[seq] = self.dups.get(seq, 0) + dup

    def drop(self, seq: int) -> None:
        """Free an idle sequence's cells (seq_rm) and id."""
        self.ctx.seq_rm(seq)
        self.tree.remove(seq)
        self.dups.pop(seq, None)
        self.idle.pop(seq, None)
        self.free.append(seq)

    def pin(self, tokens: list[int]) -> int:
        """A sequence id for a snapshot of tokens, never evicted; the caller restores it."""
        seq = self.free.pop(0)
        self._insert(seq, tokens, None, next(self._pin_ids))
        self.pinned.add(seq)
        return seq

    def unpin_failed(self, seq: int) -> None:
        """Forget a pinned sequence whose restore failed."""
        self.pinned.discard(seq)
        self.tree.remove(seq)
        self.dups.pop(seq, None)
        self.free.append(seq)

    def shared_prefixes(self, top: int = 10) -> list[dict[str, Any]]:
        """The shared runs, longest first: tokens, end position and how many sequences read
        them (live ones apart), for the status page."""
        runs = [n for n in self.tree.runs() if len(n.holders) > 1]
        runs.sort(key=lambda n: (-len(n.tokens), n.depth))
        return [
            {
                "start": n.depth,
                "tokens": len(n.tokens),
                "sequences": len(n.holders),
                "live": len(n.holders & self.live.keys()),
                "pinned": bool(n.holders & self.pinned),
            }
            for n in runs[:top]
        ]

    def audit(self) -> list[str]:
        """What llama.cpp's cells say against the tree: each resident sequence's last
        position, and no position in a free sequence. Empty when they agree."""
        out = []
        for seq in self.tree.seqs:
            if seq in self.live:
                continue  # decoding: its cells grow step by step
            held = self.tree.holds(seq)
            last = self.ctx.seq_pos_max(seq)
            if last is None or last + 1 != held:
                out.append(f"seq {seq}: the tree says {held} tokens, llama.cpp {last}")
        for seq in self.free:
            if self.ctx.seq_pos_max(seq) is not None:
                out.append(f"free seq {seq} still holds cells")
        return out
