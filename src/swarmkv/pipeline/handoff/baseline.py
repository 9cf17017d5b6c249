"""baseline mode: no sharing at all, the cost SwarmKV removes and the answers it must match."""

from __future__ import annotations

import functools
import time

from ...engine.result import BranchResult, ms
from ...engine.single import prefill
from ..dag import Dag, NodeContext
from ..nodes import BranchNode
from .base import Handoff, Plan, result_of, run_branch


class BaselineHandoff(Handoff):
    """The reference: every branch prefills the whole document itself in a fresh context,
    in the same chunks as the shared prefill, then decodes its prompt."""

    name = "baseline"
    restores_prefix = False  # the reference prefills every token, snapshot or not

    def build(self, plan: Plan) -> Dag:
        """The DAG: the document node, then one node per branch that prefills it itself."""
        dag = Dag()
        dag.add(plan.doc.name, lambda n: _baseline_doc(plan))
        for b in plan.branches:
            after = [plan.doc.name, *(a for a in b.after if a != plan.doc.name)]
            dag.add(b.name, functools.partial(_baseline_branch, plan, b), after=after)
        return dag


def _baseline_doc(plan: Plan) -> list[int]:
    plan.ledger.prefix_ready(len(plan.doc_tokens))
    return plan.doc_tokens


def _baseline_branch(plan: Plan, b: BranchNode, nctx: NodeContext) -> BranchResult:
    w = plan.prefix_len(b)
    bounds = [(lo, hi) for lo, hi in plan.bounds() if hi <= w]  # the prefill's own chunks
    with plan.slots.hold():
        nctx.check_cancelled()  # the run may have stopped while this branch waited
        ready = time.perf_counter_ns()
        with plan.context(plan.n_ctx) as ctx:
            t = time.perf_counter_ns()
            prefill(ctx, plan.doc_tokens, bounds, check=nctx.check_cancelled)
            prefill_ns = time.perf_counter_ns() - t
            plan.ledger.prefill_done(prefill_ns)
            req = plan.request(b, 0, nctx.inputs)
            run_branch(plan, ctx, req, nctx)
    return result_of(plan, b, req, ready, prefill_ms=ms(prefill_ns))
