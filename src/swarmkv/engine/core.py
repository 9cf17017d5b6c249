"""The engine: every shared-context decode in SwarmKV is a loop of `Engine.step()`.

One step:
  1. schedule: admit waiting requests whose prefix is decoded, in the policy's order, while
     a sequence id and KV cells are free (the prefix shared by seq_cp: zero copy); the first
     that does not fit stops admission, so the policy's order holds;
  2. one llama_decode of the rows the packing chose (packing.py);
  3. postprocess: commit what the decode wrote (document tokens, prompt positions), sample
     each row that ends a prompt or a generation step, retire finished requests (seq_rm).

Nothing is counted as decoded before the decode returns: a failed decode fails the
documents and requests that had rows in it, with the reason, and the engine goes on with
the rest. A document that failed fails every request that waits for it.

Fork pipelines drive the engine in the caller's thread; the swarm on a worker thread; host,
baseline and snapshot creation use it for their one-sequence prefill and decode.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ..errors import SwarmKVError
from .packing import StepPlan, packing
from .policy import Fifo, Policy
from .sequence import new_state
from .stats import DecodeStats
from .work import Document, Request, SeqIds

log = logging.getLogger("swarmkv.engine")


def share_prefix(ctx: Any, src: int, seqs: list[int], w: int, *, whole_stream: bool = False) -> int:
    """Zero-copy fork: each sequence in seqs joins the first w cells of src
    (llama_memory_seq_cp); whole_stream copies src's whole stream (one KV stream per
    sequence: src must hold exactly w tokens now). Returns the ns per sequence."""
    t = time.perf_counter_ns()
    for s in seqs:
        if whole_stream:
            ctx.seq_cp(src, s)
        else:
            ctx.seq_cp(src, s, 0, w)
    return (time.perf_counter_ns() - t) // max(len(seqs), 1)


def _compute_masks(guides: list[Any]) -> None:
    """The constrained rows' masks of one step, together (llguidance's threads)."""
    if guides:
        from ..llama.guide import compute_masks

        compute_masks(guides)


class DecodeFailed(SwarmKVError):
    """A llama_decode that held this document's or request's rows failed."""


class Engine:
    """Documents and requests over one context (see the module docstring). Not thread-safe
    by itself: one thread steps it; `lock` (held while admitting and retiring) lets other
    threads submit and read its lists, as the swarm does."""

    def __init__(
        self,
        ctx: Any,
        *,
        n_batch: int | None = None,
        packing_name: str = "mixed",
        policy: Policy | None = None,
        stats: DecodeStats | None = None,
        seq_ids: SeqIds | None = None,
        lock: AbstractContextManager[Any] | None = None,
        batch: Any = None,
        make_sampler: Any = None,
    ) -> None:
        self.ctx = ctx
        # llama.cpp clamps a context's n_batch to its n_ctx: never ask for more rows than that
        self.n_batch = min(n_batch or ctx.n_batch, ctx.n_batch)
        self.compose = packing(packing_name)
        self.policy: Policy = policy or Fifo()
        self.stats = stats
        self.seq_ids = seq_ids
        self.lock: AbstractContextManager[Any] = lock or nullcontext()
        self.make_sampler = make_sampler
        self.docs: list[Document] = []
        self.waiting: list[Request] = []
        self.live: list[Request] = []
        self.decode: Callable[[Any], None] = ctx.decode  # a test may replace it (a fault)
        self.turn = 0  # per_branch's round robin
        self.steps = 0
        self.decode_ns = 0
        self.tokens_generated = 0
        self.t0_ns = time.perf_counter_ns()
        self._own_batch = batch is None
        if batch is None:
            from ..llama.batch import Batch

            batch = Batch(max(self.n_batch, ctx.n_seq_max), 1)
        self.batch = batch

    # -- work in ------------------------------------------------------------------------------
    def add_document(self, doc: Document) -> None:
        """Decode doc's remaining tokens in the steps to come."""
        self.docs.append(doc)

    def submit(self, req: Request) -> None:
        """Queue req; it is admitted once its prefix is in the cells."""
        self.waiting.append(req)

    @property
    def busy(self) -> bool:
        """Whether anything is decoding or could be admitted."""
        return bool(self.live or any(d.pending for d in self.docs) or self._admissible())

    # -- the step -----------------------------------------------------------------------------
    def step(self) -> bool:
        """Admit, decode once, postprocess; False when there was nothing to decode."""
        t0 = time.perf_counter_ns()
        now_s = (t0 - self.t0_ns) / 1e9
        with self.lock:
            self._admit(now_s)
        self.batch.clear()
        plan = self.compose(self, self.batch, now_s)
        if plan.empty:
            return False
        t = time.perf_counter_ns()
        try:
            self.decode(self.batch)
        except Exception as exc:  # fail what was in it, keep the rest going
            log.error("decode failed: %s", exc)
            self._fail_step(plan, exc)
            return True
        decode_ns = time.perf_counter_ns() - t
        self.steps += 1
        self.decode_ns += decode_ns
        self._commit_docs(plan, decode_ns)
        captured = self._sample(plan)
        self._count(plan, t0, decode_ns, captured)
        return True

    def run(self, check: Callable[[], None] | None = None) -> None:
        """Step until nothing is left to do; check() (which may raise) between steps."""
        while True:
            if check is not None:
                check()
            if not self.step():
                return

    # -- scheduling ---------------------------------------------------------------------------
    def _admissible(self) -> bool:
        for req in self.waiting:
            doc = req.doc
            if doc is not None and doc.error is not None:
                return True  # to be failed
            if doc is None or doc.has(req.prefix_len):
                if req.seq_id is not None or self.seq_ids is None:
                    return True
                if self.seq_ids.can_take(req.cells):
                    return True
        return False

    def _admit(self, now_s: float) -> None:
        for req in [r for r in self.waiting if r.doc is not None and r.doc.error is not None]:
            self.waiting.remove(req)
            assert req.doc is not None and req.doc.error is not None
            req.error = req.doc.error
            self._finish_unadmitted(req)
        ready = [r for r in self.waiting if r.doc is None or r.doc.has(r.prefix_len)]
        for waiting in self.policy.admit_order(ready, now_s):
            assert isinstance(waiting, Request)
            req = waiting
            if req.seq_id is None:
                if self.seq_ids is None or not self.seq_ids.can_take(req.cells):
                    break  # keep the policy's order: nobody overtakes the first that waits
                req.seq_id = self.seq_ids.take(req.cells)
                req.own_seq = True
                assert req.doc is not None
                share_prefix(self.ctx, req.doc.seq_id, [req.seq_id], req.prefix_len)
            self._start(req)

    def _start(self, req: Request) -> None:
        assert req.seq_id is not None

        def on_token(name: str, token: int, piece: str) -> None:
            req.token_ns.append(time.perf_counter_ns())
            if req.on_token is not None:
                req.on_token(name, token, piece)

        req.state = new_state(
            self.ctx.model,
            req.name,
            req.seq_id,
            req.prompt,
            req.prefix_len,
            req.n_predict,
            req.sampler,
            stop=req.stop,
            on_token=on_token,
            keep_logits=req.keep_logits,
            make_sampler=self.make_sampler,
            on_row=req.on_row,
        )
        req.admit_ns = time.perf_counter_ns()
        self.waiting.remove(req)
        self.live.append(req)

    # -- postprocessing -----------------------------------------------------------------------
    def _commit_docs(self, plan: StepPlan, decode_ns: int) -> None:
        for doc, _lo, hi in plan.docs:
            doc.done = hi
            doc.decode_ns += decode_ns
            if doc.on_progress is not None and any(b[1] == hi for b in doc.bounds):
                doc.on_progress(hi)

    def _sample(self, plan: StepPlan) -> int:
        """Advance positions, sample each logits row, retire what finished; returns the ns
        spent copying logits for fidelity checks (not the product's time)."""
        captured = 0
        rows: list[tuple[Request, int]] = []
        for req, n, row in plan.prompts:
            assert req.state is not None
            req.prompt_done += n
            req.state.pos += n
            if row is not None:
                rows.append((req, row))
        for req, n, row in plan.gens:
            assert req.state is not None
            req.state.pos += n
            del req.state.pending[:n]
            if row is not None:
                rows.append((req, row))
        _compute_masks([r.state.guide for r, _row in rows if r.state and r.state.guide])
        for req, row in rows:
            st = req.state
            assert st is not None
            before = st.capture_ns
            try:
                st.take(self.ctx, row)
            except Exception as exc:  # a raising callback fails its own branch only
                st.fail(exc)
            captured += st.capture_ns - before
            if st.done:
                self._retire(req)
        return captured

    def _count(self, plan: StepPlan, t0: int, decode_ns: int, captured: int) -> None:
        if self.stats is None:
            return
        step_ns = time.perf_counter_ns() - t0
        if plan.gens:
            self.stats.add_step(step_ns - captured, decode_ns, captured)
        elif plan.prompts:
            self.stats.add_prompts(step_ns - captured, 1)

    def _retire(self, req: Request) -> None:
        st = req.state
        assert st is not None and req.seq_id is not None
        st.t_end_ns = time.perf_counter_ns()
        if not (req.keep_cells and st.error is None):
            self.ctx.seq_rm(req.seq_id)
        with self.lock:
            self.live.remove(req)
            if req.own_seq and self.seq_ids is not None:
                self.seq_ids.give_back(req.seq_id, req.cells)
        self.tokens_generated += len(st.tokens)
        st.sampler.close()
        if req.on_finish is not None:
            req.on_finish(req)

    def _finish_unadmitted(self, req: Request) -> None:
        if req.on_finish is not None:
            req.on_finish(req)

    # -- failure and teardown -----------------------------------------------------------------
    def _fail_step(self, plan: StepPlan, exc: Exception) -> None:
        """Nothing of the step was committed: its documents fail (their cells may be partly
        written), and so does every request that had a row in it."""
        for doc, _lo, _hi in plan.docs:
            doc.error = DecodeFailed(f"document {doc.name!r}: llama_decode failed: {exc}")
            doc.error.__cause__ = exc
        failed = [r for r, _n, _row in plan.prompts] + [r for r, _n, _row in plan.gens]
        for req in dict.fromkeys(failed):
            assert req.state is not None
            err = DecodeFailed(f"branch {req.name!r}: llama_decode failed: {exc}")
            err.__cause__ = exc
            req.state.fail(err)
            self._retire(req)

    def cancel(self, req: Request, error: BaseException) -> None:
        """Fail one request with error (its client went away): a live one is retired now,
        its cells freed; a waiting one leaves the queue. A finished one is left as it is."""
        if req in self.live:
            assert req.state is not None
            req.state.fail(error)
            self._retire(req)
        elif req in self.waiting:
            with self.lock:
                self.waiting.remove(req)
            req.error = error
            self._finish_unadmitted(req)

    def abort(self, error: BaseException) -> None:
        """Fail every live and waiting request with error (a stop, a close, a cancel)."""
        for req in list(self.live):
            assert req.state is not None
            req.state.fail(error)
            self._retire(req)
        with self.lock:
            waiting, self.waiting = self.waiting, []
        for req in waiting:
            req.error = error
            self._finish_unadmitted(req)

    def close(self) -> None:
        """Free the batch the engine made; the caller owns the context."""
        if self._own_batch:
            self.batch.close()
