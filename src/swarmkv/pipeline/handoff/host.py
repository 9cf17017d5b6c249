"""host mode: the document's state crosses host memory once, then one copy per branch."""

from __future__ import annotations

import functools
import threading
import time

from ...engine.result import BranchResult, ms
from ...engine.single import prefill
from ...kv.snapshot import KVSnapshot, capture, restore
from ...llama.budget import DEFAULT_HEADROOM, round_ctx
from ...llama.config import default_threads
from ...llama.context import Context
from ..concurrency import Slots
from ..dag import Dag, NodeContext
from ..nodes import BranchNode
from .base import Handoff, Plan, deps, prefix_input, result_of, run_branch


class HostHandoff(Handoff):
    """The paper's design: the prefix goes once into a pool buffer; each branch copies the
    bytes (copy-on-fork) and restores them into a context of its own.

    The branch contexts are made before the prefill, one per slot, and each branch takes one
    whose KV memory it clears first (a cleared context places cells exactly as a new one):
    a branch that may start then starts at once, with no context to make on its path."""

    name = "host"

    def __init__(self) -> None:
        super().__init__()
        self.contexts = ContextStash()

    def slots(self, plan: Plan) -> Slots:
        """With batch-invariant kernels the branch contexts decode side by side, the cores
        split among them (ConcurrencyPolicy): their answers do not depend on the threads.
        Plain kernels' do (a one-row attention splits its cells by thread), so plain branches
        take every core one after another, the baseline's way."""
        threads = plan.base.n_threads or default_threads()
        return plan.policy.slots(threads, len(plan.branches), split=plan.base.batch_invariant)

    def build(self, plan: Plan) -> Dag:
        """The DAG: the prefill node (makes the branch contexts, captures snapshots), then
        one node per branch."""
        dag = Dag()
        dag.add(plan.doc.name, lambda n: _host_prefill(plan, self.contexts, n))
        for b in plan.branches:
            dag.add(
                b.name,
                functools.partial(_host_branch, plan, self.contexts, b),
                after=deps(plan, b),
            )
        return dag

    def close(self) -> None:
        """Free the branch contexts (every node thread has ended)."""
        self.contexts.close()


class ContextStash:
    """Branch contexts made ahead, taken and given back under the run's slots (at most one
    per slot exists, so a branch holding a slot always finds one)."""

    def __init__(self) -> None:
        self._free: list[Context] = []
        self._all: list[Context] = []
        self._lock = threading.Lock()

    def make(self, plan: Plan, n: int) -> None:
        for _ in range(n):
            ctx = plan.context(plan.n_ctx, **plan.slots.overrides())
            with self._lock:
                self._all.append(ctx)
                self._free.append(ctx)

    def take(self, plan: Plan) -> Context:
        """A cleared context (made here if none was made ahead: a run whose prefill failed
        still has branches settle, and a snapshot start makes none)."""
        with self._lock:
            ctx = self._free.pop() if self._free else None
        if ctx is None:
            self.make(plan, 1)
            return self.take(plan)
        ctx.memory_clear()
        return ctx

    def give(self, ctx: Context) -> None:
        with self._lock:
            self._free.append(ctx)

    def close(self) -> None:
        with self._lock:
            contexts, self._all, self._free = self._all, [], []
        for ctx in contexts:
            ctx.close()


def _host_prefill(plan: Plan, contexts: ContextStash, nctx: NodeContext) -> KVSnapshot:
    # the branch contexts first, off every branch's path (and off the timed prefill)
    contexts.make(plan, min(plan.slots.count, len(plan.branches)))
    toks, full = plan.doc_tokens, len(plan.doc_tokens)
    if plan.start_is_document:  # nothing to decode
        assert plan.start is not None
        plan.ledger.keep_snapshot(plan.start, full=True, owned=False)
        plan.ledger.prefix_ready(full)
        return plan.start
    cuts = set(plan.cuts()) - {full}

    def on_progress(hi: int) -> None:
        if plan.progress:
            plan.progress(hi, full)
        if hi in cuts:  # a watermark: publish exactly the first hi tokens, keep decoding
            snap = capture(ctx, 0, plan.pool, tuple(toks[:hi]))
            plan.ledger.keep_snapshot(snap)
            plan.ledger.prefix_ready(hi)
            nctx.publish(f"prefix:{hi}", snap)

    with plan.context(round_ctx(full + DEFAULT_HEADROOM)) as ctx:
        t = time.perf_counter_ns()
        plan.restore_start(ctx, 0)  # the tokens a snapshot holds, if any
        prefill(
            ctx,
            toks,
            plan.suffix_bounds(),
            done=plan.reused,
            on_progress=on_progress,
            check=nctx.check_cancelled,
        )
        plan.ledger.prefill_done(time.perf_counter_ns() - t)
        snap = capture(ctx, 0, plan.pool, tuple(toks))
        plan.ledger.keep_snapshot(snap, full=True)
    plan.ledger.prefix_ready(full)
    return snap


def _host_branch(
    plan: Plan, contexts: ContextStash, b: BranchNode, nctx: NodeContext
) -> BranchResult:
    snap: KVSnapshot = prefix_input(plan, b, nctx.inputs)
    available = plan.ledger.ready_ns(snap.n_tokens)
    with plan.slots.hold():
        nctx.check_cancelled()  # the run may have stopped while this branch waited
        # like the baseline's: a branch may start once its input AND a context slot exist;
        # the wait for the slot is reported separately (wait_ms)
        ready = max(available, time.perf_counter_ns())
        wait_ms = ms(ready - available)
        t = time.perf_counter_ns()
        # copy-on-fork: this branch's private bytes; a read-only shared mapping of a file
        # needs no copy (nothing can write it), so branches restore straight from it
        own = snap if snap.shared else snap.fork(plan.pool)
        copy_ms = ms(time.perf_counter_ns() - t)
        ctx = contexts.take(plan)
        try:
            restore_ms = restore(ctx, 0, own)
            req = plan.request(b, 0, nctx.inputs)
            run_branch(plan, ctx, req, nctx)
        finally:
            contexts.give(ctx)
            if own is not snap:
                own.release()
    return result_of(
        plan, b, req, ready, restore_ms=restore_ms, fork_copy_ms=copy_ms, wait_ms=wait_ms
    )
