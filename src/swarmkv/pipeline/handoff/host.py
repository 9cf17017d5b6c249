"""host mode: the document's state crosses host memory once, then one copy per branch."""

from __future__ import annotations

import functools
import time

from ...engine.result import BranchResult, ms
from ...engine.single import prefill
from ...kv.snapshot import KVSnapshot, capture, restore
from ...llama.budget import DEFAULT_HEADROOM, round_ctx
from ...llama.config import default_threads
from ..concurrency import Slots
from ..dag import Dag, NodeContext
from ..nodes import BranchNode
from .base import Handoff, Plan, deps, prefix_input, result_of, run_branch


class HostHandoff(Handoff):
    """The paper's design: the prefix goes once into a pool buffer; each branch copies the
    bytes (copy-on-fork) and restores them into a fresh context of its own."""

    name = "host"

    def slots(self, plan: Plan) -> Slots:
        """Branch contexts decode side by side, the cores split among them (see
        ConcurrencyPolicy): the prefill before them has every core to itself."""
        threads = plan.base.n_threads or default_threads()
        return plan.policy.slots(threads, len(plan.branches), split=True)

    def build(self, plan: Plan) -> Dag:
        """The DAG: the prefill node (captures snapshots), then one node per branch."""
        dag = Dag()
        dag.add(plan.doc.name, lambda n: _host_prefill(plan, n))
        for b in plan.branches:
            dag.add(b.name, functools.partial(_host_branch, plan, b), after=deps(plan, b))
        return dag


def _host_prefill(plan: Plan, nctx: NodeContext) -> KVSnapshot:
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


def _host_branch(plan: Plan, b: BranchNode, nctx: NodeContext) -> BranchResult:
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
        try:
            with plan.context(plan.n_ctx, **plan.slots.overrides()) as ctx:
                restore_ms = restore(ctx, 0, own)
                req = plan.request(b, 0, nctx.inputs)
                run_branch(plan, ctx, req, nctx)
        finally:
            if own is not snap:
                own.release()
    return result_of(
        plan, b, req, ready, restore_ms=restore_ms, fork_copy_ms=copy_ms, wait_ms=wait_ms
    )
