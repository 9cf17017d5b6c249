"""What every handoff mode shares: the Plan, the Handoff interface, branch decoding.

A handoff mode decides how a branch gets the document's KV state (host.py, fork.py,
baseline.py). Pipeline.run drives every mode through the same four calls, with no mode
checks of its own:

    handoff.check(model, config)        pure checks, before any allocation
    dag = handoff.build(plan)           the DAG of prefill and branch work
    dag.run(...)                        every node thread joined on every path
    handoff.collect(plan, dag_result)   per-branch outcomes and results
    handoff.close()                     frees what build() allocated (always, in finally)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..batch import Batch
from ..concurrency import ConcurrencyPolicy
from ..context import Context
from ..context_config import ContextConfig
from ..dag import Dag, DagResult, Dep, NodeContext
from ..decoding import (
    BranchState,
    DecodeStats,
    chunk_bounds,
    decode_prompts,
    new_state,
    step_rows,
    take_step,
)
from ..model import Model
from ..modes import ForkOptions
from ..nodes import BranchNode, PrefillNode
from ..pool import HostBufferPool
from ..results import BranchResult, NodeOutcome, ms
from ..snapshot import KVSnapshot, restore
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

    def state(self, b: BranchNode, seq_id: int, inputs: dict[str, Any]) -> BranchState:
        """A BranchState (with a new Sampler) for b on seq_id; its prompt rendered, tokenized."""
        prompt = b.prompt_tokens(self.model, self.upstream_text(b, inputs))
        return new_state(
            self.model,
            b.name,
            seq_id,
            prompt,
            self.prefix_len(b),
            b.n_predict,
            b.sampler,
            stop=b.stop,
            on_token=b.on_token,
            keep_logits=self.keep_logits,
        )


def result_of(
    plan: Plan,
    b: BranchNode,
    st: BranchState,
    t_ready_ns: int,
    t_decode_ns: int,
    **timings: float | None,
) -> BranchResult:
    """Raise the branch's own error, else package its output and timings."""
    if st.error is not None:
        raise st.error
    first, end = st.span_ns()
    return BranchResult(
        name=b.name,
        prompt=b.prompt,
        text=st.text,
        tokens=tuple(st.tokens),
        stop_reason=st.stop_reason or "error",
        prefix_tokens=plan.prefix_len(b),
        prompt_tokens=len(st.prompt_tokens),
        activation_ms=ms(first - t_ready_ns),
        decode_ms=ms(end - t_decode_ns),
        first_token_ms=ms(first - plan.t0_ns),
        end_ms=ms(end - plan.t0_ns),
        step_logits=tuple(st.step_logits),
        restore_ms=timings.get("restore_ms"),
        fork_copy_ms=timings.get("fork_copy_ms"),
        prefill_ms=timings.get("prefill_ms"),
        wait_ms=timings.get("wait_ms"),
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


def run_branch(plan: Plan, ctx: Context, states: list[BranchState], nctx: NodeContext) -> None:
    """Decode the branches' prompts, then generate until each stops; finished branches free
    their cells (seq_rm). Cancellation is checked between decodes, never inside one.

    packing="batched": one llama_decode per step for all live branches, each sampling from
    its own row (fastest). "per_branch": one decode per branch per step, which keeps every
    matrix shape equal to a lone branch's (see modes.ForkOptions).
    """
    packing = plan.fork.packing
    with Batch(max(plan.base.n_batch, len(states)), 1) as batch:
        decode_prompts(ctx, states, batch, packing, plan.stats, nctx.check_cancelled)
        live = [s for s in states if not s.done]
        while live:
            nctx.check_cancelled()
            for group in [live] if packing == "batched" else [[s] for s in live]:
                t_step = time.perf_counter_ns()
                rows = step_rows(batch, group)
                t_decode = time.perf_counter_ns()
                ctx.decode(batch)  # the step itself: one llama_decode for the group
                take_step(ctx, rows, plan.stats, t_step, time.perf_counter_ns() - t_decode)
            for state in live:
                if state.done:
                    ctx.seq_rm(state.seq_id)
            live = [s for s in live if not s.done]
