"""fork mode: one context, a unified KV cache, the prefix shared with llama_memory_seq_cp.

One Engine (engine/core.py) runs the whole pipeline in the caller's thread: the document is
a Document on sequence 0; each branch a Request on its own sequence. When the document's
decoded tokens reach a branch's watermark, the prefix is shared to its sequence (seq_cp:
zero copy) and the branch is admitted at the next step, while the document goes on. A branch
that reads upstream branches is submitted when they finish, and joins the running batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ...checks import check_seconds
from ...engine.core import Engine
from ...engine.core import share_prefix as engine_share
from ...engine.result import BranchResult, ms
from ...engine.work import Document, Request
from ...errors import ConfigError
from ...llama.config import ContextConfig
from ...llama.context import Context
from ...llama.model import Model
from ...process.interrupt import INTERRUPT, Interrupted
from ..dag import Cancelled, Dag, StopWhen
from ..modes import ForkOptions
from ..nodes import BranchNode
from ..results import NodeOutcome
from .base import Handoff, Plan, result_of


class ForkHandoff(Handoff):
    """Zero-copy fan-out in one context: branches share the prefix cells (seq_cp) and
    decode together, one llama_decode per step (ForkOptions picks layout and packing)."""

    name = "fork"

    def __init__(self, options: ForkOptions) -> None:
        self.options = options
        self.share: Share = share_prefix  # how branch sequences get the prefix cells
        self.shares_context = options.layout == "unified"
        self._ctx: Context | None = None

    def check(self, model: Model, config: ContextConfig) -> None:
        """Raise ConfigError on a sliding-window model without swa_full, before any allocation."""
        if model.n_swa > 0 and not config.resolved_swa_full(model):
            # forked sequences share every SWA cell, so none can be recycled as the window
            # slides, and a window-sized SWA cache fills up at the first branch token
            raise ConfigError(
                "fork mode needs swa_full=True on a sliding-window model "
                f"(n_swa={model.n_swa}); use host mode for swa_full=False"
            )

    def check_start(self) -> None:
        """A snapshot's state records one KV stream: only the unified layout can take it."""
        if self.options.layout == "streams":
            raise ConfigError(
                "fork layout 'streams' keeps one KV stream per sequence and cannot restore a "
                "snapshot (it records one stream): use layout 'unified' (the default) or host"
            )

    def build(self, plan: Plan) -> Dag:
        """Fork runs no DAG: execute() drives the engine (the spec's DAG is validated apart)."""
        raise NotImplementedError("fork mode runs on the engine: call execute()")

    def packing_for(self, plan: Plan) -> str:
        """The engine packing: everything in one decode with batch-invariant kernels (any
        packing gives the same answers); without them, the shapes the baseline's answers
        are judged against (phased: a fork wave's; per_branch: a lone branch's)."""
        if self.options.packing == "per_branch":
            return "per_branch"
        return "mixed" if plan.base.batch_invariant else "phased"

    def execute(
        self, plan: Plan, *, timeout_s: float | None, cancel: threading.Event | None
    ) -> tuple[dict[str, NodeOutcome], dict[str, BranchResult]]:
        """Run the document and every branch on one engine in this thread."""
        check_seconds("timeout_s", timeout_s)
        n_seq = len(plan.branches) + 1
        if self.options.layout == "streams":  # each stream as large as a baseline context
            ctx = plan.context(plan.n_ctx * n_seq, n_seq_max=n_seq, kv_unified=False)
        else:
            ctx = plan.context(plan.n_ctx, n_seq_max=n_seq, kv_unified=True)
        self._ctx = ctx  # closed by close(), whatever happens next
        return _ForkRun(plan, self, StopWhen(timeout_s, cancel), ctx).execute()

    def close(self) -> None:
        """Close the shared context, if execute() made one."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None


Share = Callable[[Plan, Context, list[int], int], None]


def share_prefix(plan: Plan, ctx: Context, seqs: list[int], w: int) -> None:
    """Zero-copy fork at a watermark: the branch sequences join the first w prefix cells
    (the engine's share_prefix; streams: stream 0 holds exactly w tokens right now)."""
    per_seq = engine_share(ctx, 0, seqs, w, whole_stream=plan.fork.layout == "streams")
    plan.ledger.prefix_ready(w, share_ns=per_seq)


class _ForkRun:
    """One fork run: the context, the engine, and each branch's outcome as it settles."""

    def __init__(self, plan: Plan, mode: ForkHandoff, stop: StopWhen, ctx: Context) -> None:
        self.plan, self.mode, self.stop, self.ctx = plan, mode, stop, ctx
        self.seq_of = {b.name: i + 1 for i, b in enumerate(plan.branches)}
        self.by_cut: dict[int, list[int]] = {}
        for b in plan.branches:
            self.by_cut.setdefault(plan.prefix_len(b), []).append(self.seq_of[b.name])
        self.outcomes: dict[str, NodeOutcome] = {}
        self.results: dict[str, BranchResult] = {}
        self.t_start = time.perf_counter_ns()
        self.doc = Document(
            plan.doc.name,
            plan.doc_tokens,
            0,
            plan.suffix_bounds(),
            plan.reused,
            self._on_progress,
        )
        self.engine = Engine(
            self.ctx,
            n_batch=plan.base.n_batch,
            packing_name=mode.packing_for(plan),
            stats=plan.stats,
        )

    def _on_progress(self, hi: int) -> None:
        full = len(self.plan.doc_tokens)
        if self.plan.progress:
            self.plan.progress(hi, full)
        if hi == full:
            self.plan.ledger.prefill_done(time.perf_counter_ns() - self.t_start)
        if hi in self.by_cut or hi == full:
            self.mode.share(self.plan, self.ctx, self.by_cut.get(hi, []), hi)

    def execute(self) -> tuple[dict[str, NodeOutcome], dict[str, BranchResult]]:
        plan = self.plan
        try:
            self.plan.restore_start(self.ctx, 0)  # the tokens a snapshot holds, if any
            if self.doc.ready:  # nothing to decode: the prefix is there already
                self._on_progress(len(plan.doc_tokens))
            self.engine.add_document(self.doc)
            for b in plan.branches:
                if not self._upstream(b):
                    self._submit(b)
            self.engine.run(self.stop.check)
        except Cancelled as exc:
            self.engine.abort(exc)
        except BaseException as exc:
            self.engine.abort(exc)
            raise
        finally:
            self.engine.close()
        self._settle_document()
        for b in plan.branches:  # never submitted: an upstream branch did not finish
            if b.name not in self.outcomes:
                self._settle_unrun(b)
        if INTERRUPT.is_set():
            raise Interrupted("interrupted")  # Ctrl-C in a CLI: unwind the caller too
        order = [plan.doc.name, *(b.name for b in plan.branches)]
        return {n: self.outcomes[n] for n in order}, self.results

    def _upstream(self, b: BranchNode) -> list[str]:
        return [a for a in b.after if a != self.plan.doc.name]

    def _submit(self, b: BranchNode) -> None:
        try:
            req = self.plan.request(b, self.seq_of[b.name], self.results, self.doc)
        except Exception as exc:  # its prompt could not be rendered or tokenized
            self.outcomes[b.name] = NodeOutcome(b.name, "failed", repr(exc), exc)
            self.ctx.seq_rm(self.seq_of[b.name])
            self._release_dependents(b)
            return
        req.on_finish = lambda r, b=b: self._finished(b, r)
        self.engine.submit(req)

    def _finished(self, b: BranchNode, req: Request) -> None:
        st = req.state
        error = req.error if st is None else st.error
        if error is None:
            w = self.plan.prefix_len(b)
            ledger = self.plan.ledger
            shared = ms(ledger.share_ns(w))
            self.results[b.name] = result_of(
                self.plan, b, req, ledger.ready_ns(w), restore_ms=shared
            )
            self.outcomes[b.name] = NodeOutcome(b.name, "ok")
        elif isinstance(error, Cancelled):
            self.outcomes[b.name] = NodeOutcome(b.name, "cancelled", str(error), error)
        elif error is self.doc.error:
            reason = f"upstream {self.plan.doc.name} failed"
            self.outcomes[b.name] = NodeOutcome(b.name, "skipped", reason)
        else:
            self.outcomes[b.name] = NodeOutcome(b.name, "failed", repr(error), error)
        self._release_dependents(b)

    def _release_dependents(self, done: BranchNode) -> None:
        """Submit each branch whose upstream branches have all finished ok; skip those with
        one that did not (freeing the prefix cells their sequence was given)."""
        for b in self.plan.branches:
            ups = self._upstream(b)
            if done.name not in ups or b.name in self.outcomes:
                continue
            bad = [a for a in ups if a in self.outcomes and self.outcomes[a].status != "ok"]
            stopped = self.stop.reason()
            if bad or stopped is not None:
                self.outcomes[b.name] = (
                    NodeOutcome(b.name, "cancelled", stopped)
                    if stopped is not None
                    else NodeOutcome(b.name, "skipped", f"upstream {bad[0]} failed")
                )
                self.ctx.seq_rm(self.seq_of[b.name])
                self._release_dependents(b)
            elif all(a in self.results for a in ups):
                self._submit(b)

    def _settle_document(self) -> None:
        name = self.plan.doc.name
        if self.doc.error is not None:
            err = self.doc.error
            self.outcomes[name] = NodeOutcome(name, "failed", repr(err), err)
        elif self.doc.ready:
            self.outcomes[name] = NodeOutcome(name, "ok")
        else:
            reason = self.stop.reason() or "cancelled"
            self.outcomes[name] = NodeOutcome(name, "cancelled", reason)

    def _settle_unrun(self, b: BranchNode) -> None:
        reason = self.stop.reason()
        if reason is not None:
            self.outcomes[b.name] = NodeOutcome(b.name, "cancelled", reason)
        else:
            ups = [a for a in self._upstream(b) if self.outcomes.get(a, None) is None]
            why = f"upstream {ups[0]} did not finish" if ups else "not run"
            self.outcomes[b.name] = NodeOutcome(b.name, "skipped", why)
