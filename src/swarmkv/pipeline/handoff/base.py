"""What every handoff mode shares: the Plan, the Handoff interface, branch decoding.

A handoff mode decides how a branch gets the document's KV state (host.py, fork.py,
baseline.py). Pipeline.run drives every mode through the same four calls, with no mode
checks of its own:

    handoff.check(model, config)        pure checks, before any allocation
    handoff.execute(plan, ...)          outcomes and results: by default the DAG of
                                        build(plan) run to the end (every node thread
                                        joined on every path), then collect(); fork and
                                        device drive one Engine in the caller's thread
    handoff.close()                     frees what execute() allocated (always, in finally)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ...engine.result import result_of as branch_result
from ...engine.sequence import chunk_bounds
from ...engine.single import decode_branch
from ...engine.stats import DecodeStats
from ...engine.work import Document, Request
from ...kv.snapshot import KVSnapshot, restore
from ...llama.config import ContextConfig, default_threads
from ...llama.context import Context
from ...llama.model import Model
from ...llama.pool import HostBufferPool
from ..concurrency import ConcurrencyPolicy, Slots
from ..dag import Dag, DagResult, Dep, NodeContext
from ..modes import ForkOptions
from ..nodes import BranchNode, PrefillNode
from ..results import BranchResult, NodeOutcome
from .ledger import RunLedger


class Handoff:
    """One way to hand the document's KV state to branches. Subclasses set `name` and
    implement build(); the defaults suit modes with one DAG node per branch."""

    name = ""
    shares_context = False  # True: every branch lives in one context (budget: "fork")
    restores_prefix = True  # False: ignores a starting snapshot (baseline prefills it all)

    def check(self, model: Model, config: ContextConfig) -> None:
        """Raise ConfigError for settings this mode cannot run; no native work."""

    def check_start(self) -> None:
        """Raise ConfigError if this mode cannot start from a snapshot; no native work."""

    def build(self, plan: Plan) -> Dag:
        """The DAG of prefill and branch work for plan; subclasses must implement it."""
        raise NotImplementedError

    def execute(
        self, plan: Plan, *, timeout_s: float | None, cancel: threading.Event | None
    ) -> tuple[dict[str, NodeOutcome], dict[str, BranchResult]]:
        """Run the plan: the DAG of build(plan) on a bounded pool of node threads (one per
        context slot, plus the prefill), then collect()."""
        plan.slots = self.slots(plan)
        workers = plan.slots.count + 1
        dres = self.build(plan).run(timeout_s=timeout_s, cancel=cancel, max_workers=workers)
        return self.collect(plan, dres)

    def slots(self, plan: Plan) -> Slots:
        """This mode's branch-context slots (ConcurrencyPolicy.slots; host splits the cores)."""
        threads = plan.base.n_threads or default_threads()
        return plan.policy.slots(threads, len(plan.branches), split=False)

    def collect(
        self, plan: Plan, dres: DagResult
    ) -> tuple[dict[str, NodeOutcome], dict[str, BranchResult]]:
        """Outcome of the document node and of every branch, and the branches' results."""
        outcomes = {plan.doc.name: _outcome(dres, plan.doc.name)}
        branches: dict[str, BranchResult] = {}
        for b in plan.branches:
            outcomes[b.name] = _outcome(dres, b.name)
            value = dres[b.name].value
            if isinstance(value, BranchResult):
                branches[b.name] = value
        return outcomes, branches

    def close(self) -> None:
        """Free what build() allocated; called after the DAG's threads have all ended."""


def _outcome(dres: DagResult, name: str) -> NodeOutcome:
    nr = dres[name]
    return NodeOutcome(name, nr.status, nr.reason, nr.error)


@dataclass
class Plan:
    """Everything a mode needs, validated and tokenized before any context exists."""

    model: Model
    doc: PrefillNode
    doc_tokens: list[int]
    branches: list[BranchNode]  # topological order
    base: ContextConfig  # n_batch, threads, swa_full, flash_attn, kv types
    n_ctx: int  # branch contexts (host, baseline) or the shared context (fork)
    pool: HostBufferPool
    policy: ConcurrencyPolicy
    t0_ns: int
    fork: ForkOptions = field(default_factory=ForkOptions)
    stats: DecodeStats = field(default_factory=DecodeStats)
    keep_logits: bool | str = False
    progress: Callable[[int, int], None] | None = None
    ledger: RunLedger = field(default_factory=RunLedger)  # written by the node threads
    reused: int = 0  # leading document tokens restored from `start` instead of prefilled
    start: KVSnapshot | None = None  # the snapshot they come from (set by Pipeline.run)
    slots: Slots = field(default_factory=lambda: Slots(1, None))  # set by Handoff.execute

    def prefix_len(self, b: BranchNode) -> int:
        """How many document tokens branch b reads: its required_prefix_tokens or all."""
        return b.required_prefix_tokens or len(self.doc_tokens)

    def suffix_bounds(self) -> list[tuple[int, int]]:
        """The prefill's chunks after the reused tokens (all of bounds() when none are)."""
        r = self.reused
        full = len(self.doc_tokens)
        cuts = [c - r for c in self.cuts() if c > r]
        return [(lo + r, hi + r) for lo, hi in chunk_bounds(full - r, self.base.n_batch, cuts)]

    def restore_start(self, ctx: Context, seq_id: int) -> None:
        """Restore the reused tokens into seq_id of ctx (timed as part of the prefill): the
        snapshot, less the tail the document does not share (SnapshotSource.reusable)."""
        if self.reused:
            assert self.start is not None
            restore(ctx, seq_id, self.start)
            if self.reused < self.start.n_tokens:
                ctx.seq_rm(seq_id, self.reused, None)

    @property
    def start_is_document(self) -> bool:
        """Whether the starting snapshot is exactly the document (nothing to decode)."""
        full = len(self.doc_tokens)
        return self.start is not None and self.reused == full == self.start.n_tokens

    def cuts(self) -> list[int]:
        """The distinct prefix lengths the branches read, sorted (the prefill's watermarks)."""
        return sorted({self.prefix_len(b) for b in self.branches})

    def bounds(self) -> list[tuple[int, int]]:
        """Prefill chunks of at most n_batch tokens with every cut a boundary (chunk_bounds)."""
        return chunk_bounds(len(self.doc_tokens), self.base.n_batch, self.cuts())

    def context(self, n_ctx: int, **kw: Any) -> Context:
        """A new Context of n_ctx cells with the base config; kw overrides other fields."""
        ctx = Context(self.model, replace(self.base, n_ctx=n_ctx, **kw))
        self.ledger.context_opened(ctx)
        return ctx

    def upstream_text(self, b: BranchNode, inputs: dict[str, Any]) -> dict[str, str]:
        """The text of each upstream branch b's prompt names as {name}, from the node inputs."""
        return {n: inputs[n].text for n in b.placeholders()}

    def request(
        self,
        b: BranchNode,
        seq_id: int,
        inputs: dict[str, Any],
        doc: Document | None = None,
    ) -> Request:
        """An engine Request for b on seq_id (which holds, or will hold, its prefix); its
        prompt rendered with the upstream branches' text and tokenized."""
        return Request(
            b.name,
            b.prompt_tokens(self.model, self.upstream_text(b, inputs)),
            b.n_predict,
            b.sampler,
            self.prefix_len(b),
            doc=doc,
            seq_id=seq_id,
            stop=b.stop,
            on_token=b.on_token,
            keep_logits=self.keep_logits,
        )

    @property
    def packing(self) -> str:
        """The engine packing of a one-sequence context: a lone branch's shapes."""
        return "per_branch"


def result_of(
    plan: Plan, b: BranchNode, req: Request, ready_ns: int, **timings: Any
) -> BranchResult:
    """Raise the branch's own error, else its BranchResult (engine.result.result_of): times
    from ready_ns (when it could start) and from the run's start; timings: restore_ms, ..."""
    return branch_result(
        req, ready_ns=ready_ns, t0_ns=plan.t0_ns, doc=plan.doc.name, prompt=b.prompt, **timings
    )


def deps(plan: Plan, b: BranchNode) -> list[str | Dep]:
    """The document (at the branch's watermark) plus the upstream branches it names."""
    w = plan.prefix_len(b)
    doc = plan.doc.name if w == len(plan.doc_tokens) else Dep(plan.doc.name, f"prefix:{w}")
    return [doc, *(a for a in b.after if a != plan.doc.name)]


def prefix_input(plan: Plan, b: BranchNode, inputs: dict[str, Any]) -> Any:
    """The document input branch b depends on: the full prefix, or what its watermark published."""
    w = plan.prefix_len(b)
    return (
        inputs[plan.doc.name]
        if w == len(plan.doc_tokens)
        else inputs[f"{plan.doc.name}@prefix:{w}"]
    )


def run_branch(plan: Plan, ctx: Context, req: Request, nctx: NodeContext) -> Request:
    """Decode one branch whose prefix is in its sequence, in a context of its own (host,
    baseline); cancellation is checked between decodes, never inside one."""
    return decode_branch(ctx, req, stats=plan.stats, check=nctx.check_cancelled)
