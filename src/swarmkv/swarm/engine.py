"""The swarm's scheduler loop: one context, one llama_batch per step for everything live.

Each step, under the n_batch token budget:
  1. admit waiting branches in the policy's order while a sequence id and KV cells are free
     (seq_cp of the document's prefix sequence: zero copy); the first that does not fit stops
     admission, so the policy's order holds;
  2. one row per generating branch (its last token, logits on);
  3. document prefill chunks (half the budget left when prompts also wait);
  4. prompt chunks of admitted branches, split by the policy (prompt_shares);
then one llama_decode, sampling from each row that ends a prompt or a generation step, and
finished branches free their cells (seq_rm) and sequence. With batch-invariant kernels every
branch's tokens and logits are what a context of its own computes, whatever else shares the
batch, so scheduling never changes an answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..batch import Batch
from ..context import Context
from ..decoding import BranchState, new_state
from ..errors import SwarmKVError
from .handle import SwarmClosedError
from .policy import Policy
from .work import Branch, DocJob

log = logging.getLogger("swarmkv.swarm")

Row = tuple[Branch, int, bool]  # branch, batch row, whether the row is a generation step


@dataclass
class Ledger:
    """Cells and sequence ids of the context, and what holds them: documents take ids from
    [0, max_docs), branches from the rest, so max_live bounds the live branches."""

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

    def give_back(self, seq_id: int, cells: int) -> None:
        """Return a branch's sequence id and its cells."""
        self.cells_used -= cells
        self.free["branch"].append(seq_id)


class Engine:
    """The loop. Public methods are called from any thread under `cond`; `run` is the
    scheduler thread's body and the only code that touches the context."""

    def __init__(
        self, ctx: Context, policy: Policy, n_batch: int, t0_ns: int, max_docs: int
    ) -> None:
        self.ctx = ctx
        self.policy = policy
        self.n_batch = n_batch
        self.t0_ns = t0_ns
        self.cond = threading.Condition()
        self.ledger = Ledger(ctx.n_ctx, max_docs, ctx.n_seq_max)
        self.docs: dict[str, DocJob] = {}
        self.waiting: list[Branch] = []
        self.live: list[Branch] = []
        self.finished: list[Branch] = []
        self.stopping = False
        self.steps = 0
        self.decode_ns = 0
        self.tokens_generated = 0
        self.on_finish: Callable[[Branch], None] | None = None

    # -- the scheduler thread -------------------------------------------------------------
    def run(self) -> None:
        """Step until stopped; every branch left then fails with SwarmClosedError."""
        with Batch(self.n_batch, 1) as batch:
            while self._wait_for_work():
                try:
                    self._step(batch)
                except Exception as exc:  # a failed decode: fail what was in it, go on
                    log.error("swarm step failed: %s", exc)
                    self._fail_live(exc)
        self._close_all()

    def _wait_for_work(self) -> bool:
        with self.cond:
            while not self.stopping and not self._has_work():
                self.cond.wait()
            return not self.stopping

    def _has_work(self) -> bool:
        pending_docs = any(not d.ready and d.error is None for d in self.docs.values())
        ready = [b for b in self.waiting if self.docs[b.doc].ready]
        return bool(self.live or pending_docs or (ready and self._admissible(ready)))

    def _admissible(self, ready: list[Branch]) -> bool:
        return any(self.ledger.can_take(b.cells) for b in ready)

    def _step(self, batch: Batch) -> None:
        now_s = (time.perf_counter_ns() - self.t0_ns) / 1e9
        with self.cond:
            self._admit(now_s)
        batch.clear()
        rows: list[Row] = []
        budget = self.n_batch - self._gen_rows(batch, rows)
        prefilling = [b for b in self.live if b.prompt_left > 0]
        doc_budget = budget // 2 if prefilling else budget
        budget -= self._doc_rows(batch, doc_budget)
        for b, n in self.policy.prompt_shares(prefilling, budget, now_s):
            self._prompt_rows(batch, rows, b, n)  # type: ignore[arg-type]
        if batch.n_tokens == 0:
            return
        t = time.perf_counter_ns()
        self.ctx.decode(batch)
        self.decode_ns += time.perf_counter_ns() - t
        self.steps += 1
        self._sample(rows)

    def _admit(self, now_s: float) -> None:
        ready = [b for b in self.waiting if self.docs[b.doc].ready]
        for b in self.policy.admit_order(ready, now_s):
            assert isinstance(b, Branch)
            if not self.ledger.can_take(b.cells):
                break  # keep the policy's order: nobody overtakes the first that waits
            doc = self.docs[b.doc]
            seq = self.ledger.take(b.cells)
            self.ctx.seq_cp(doc.seq_id, seq, 0, len(doc.tokens))
            b.state = self._state(b, seq, len(doc.tokens))
            b.admit_ns = time.perf_counter_ns()
            self.waiting.remove(b)
            self.live.append(b)

    def _state(self, b: Branch, seq: int, prefix: int) -> BranchState:
        def on_token(_name: str, _token: int, piece: str) -> None:
            b.token_ns.append(time.perf_counter_ns())
            b.handle._piece(piece)

        return new_state(
            self.ctx.model,
            b.name,
            seq,
            b.prompt,
            prefix,
            b.n_predict,
            b.sampler,
            stop=b.stop,
            on_token=on_token,
        )

    def _gen_rows(self, batch: Batch, rows: list[Row]) -> int:
        n = 0
        for b in self.live:
            st = b.state
            assert st is not None
            if b.prompt_left == 0 and st.tokens and not st.done:
                rows.append((b, batch.add(st.tokens[-1], st.pos, (st.seq_id,), True), True))
                n += 1
        return n

    def _doc_rows(self, batch: Batch, budget: int) -> int:
        used = 0
        for doc in self.docs.values():
            if doc.ready or doc.error is not None or used >= budget:
                continue
            hi = min(len(doc.tokens), doc.done_tokens + budget - used)
            for pos in range(doc.done_tokens, hi):
                batch.add(doc.tokens[pos], pos, (doc.seq_id,))
            used += hi - doc.done_tokens
            doc.done_tokens = hi  # counted before the decode: a failed step fails the swarm
        return used

    def _prompt_rows(self, batch: Batch, rows: list[Row], b: Branch, n: int) -> None:
        st = b.state
        assert st is not None
        for k in range(b.prompt_done, b.prompt_done + n):
            last = k == len(b.prompt) - 1
            row = batch.add(b.prompt[k], st.pos, (st.seq_id,), last)
            st.pos += 1
            if last:
                rows.append((b, row, False))
        b.prompt_done += n

    def _sample(self, rows: list[Row]) -> None:
        for b, row, is_step in rows:
            st = b.state
            assert st is not None
            if is_step:
                st.pos += 1
            try:
                st.take(self.ctx, row)
            except Exception as exc:  # a raising callback fails its own branch only
                st.fail(exc)
            if not st.done:
                continue
            st.t_end_ns = time.perf_counter_ns()
            self._retire(b)
        with self.cond:
            self.cond.notify_all()

    def _retire(self, b: Branch) -> None:
        st = b.state
        assert st is not None
        self.ctx.seq_rm(st.seq_id)
        with self.cond:
            self.live.remove(b)
            self.ledger.give_back(st.seq_id, b.cells)
            self.finished.append(b)
        self.tokens_generated += len(st.tokens)
        st.sampler.close()
        if st.error is not None:
            b.handle._finish(None, st.error)
        else:
            b.handle._finish(b.result(), None)
        if self.on_finish is not None:
            self.on_finish(b)

    def _fail_live(self, exc: BaseException) -> None:
        for b in list(self.live):
            assert b.state is not None
            b.state.fail(SwarmKVError(f"swarm step failed: {exc}"))
            b.state.t_end_ns = time.perf_counter_ns()
            self._retire(b)

    def _close_all(self) -> None:
        closed = SwarmClosedError("the swarm closed before this branch finished")
        for b in list(self.live):
            assert b.state is not None
            b.state.fail(closed)
            self._retire(b)
        with self.cond:
            waiting, self.waiting = self.waiting, []
        for b in waiting:
            b.handle._finish(None, closed)
