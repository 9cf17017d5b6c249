"""fork mode: one context, a unified KV cache, the prefix shared with llama_memory_seq_cp.

Branches are grouped in waves by their dependencies on other branches ({upstream} text);
each wave decodes as one batch per step. The shared context is created by the prefill node
and used by the waves strictly after it (DAG edges), so one thread uses it at a time.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..batch import Batch
from ..context import Context
from ..context_config import ContextConfig
from ..dag import Dag, DagResult, NodeContext, NodeResult
from ..decoding import BranchState
from ..decoding import prefill_chunks as _prefill
from ..errors import ConfigError
from ..model import Model
from ..modes import ForkOptions
from ..nodes import BranchNode
from ..results import BranchResult, NodeOutcome, ms
from .base import Handoff, Plan, result_of, run_branch


@dataclass
class Skipped:
    """A fork-mode branch's value when it did not run because an upstream branch gave no result."""

    reason: str


def waves(branches: list[BranchNode], doc: str) -> list[list[BranchNode]]:
    """Branches grouped by depth among branch dependencies; each wave decodes as one batch."""
    level: dict[str, int] = {}
    for b in branches:  # topological order: every upstream level is known
        ups = [level[a] for a in b.after if a != doc]
        level[b.name] = 1 + max(ups) if ups else 0
    out: list[list[BranchNode]] = [[] for _ in range(max(level.values()) + 1)]
    for b in branches:
        out[level[b.name]].append(b)
    return out


class ForkHandoff(Handoff):
    """Zero-copy fan-out in one context: branches share the prefix cells (seq_cp) and
    decode together, one llama_decode per step (ForkOptions picks layout and packing)."""

    name = "fork"

    def __init__(self, options: ForkOptions) -> None:
        self.options = options
        self.share: Share = share_prefix  # how branch sequences get the prefix cells
        self.shares_context = options.layout == "unified"
        self._holder: list[Context] = []  # the shared context, made by the prefill node
        self._wave_names: list[str] = []  # the DAG nodes that decode, in order

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
        """The DAG: the prefill node (creates the shared context), then one node per wave."""
        holder = self._holder
        seq_of = {b.name: i + 1 for i, b in enumerate(plan.branches)}
        dag = Dag()
        share, streams = self.share, self.options.layout == "streams"
        dag.add(plan.doc.name, lambda n: _fork_prefill(plan, holder, seq_of, n, share, streams))
        prev = plan.doc.name
        taken = {plan.doc.name, *seq_of}
        self._wave_names.clear()
        for k, group in enumerate(waves(plan.branches, plan.doc.name)):
            name = f"wave-{k}"
            while name in taken:  # never the name of a user's document or branch
                name = f"_{name}"
            self._wave_names.append(name)
            wave = functools.partial(_fork_wave, plan, holder, seq_of, group)
            dag.add(name, wave, after=[prev])
            prev = name
        return dag

    def collect(
        self, plan: Plan, dres: DagResult
    ) -> tuple[dict[str, NodeOutcome], dict[str, BranchResult]]:
        """Per-branch outcomes from the wave nodes; a branch whose wave never delivered a
        value takes that wave's status (the first wave that did not finish ok)."""
        doc = dres[plan.doc.name]
        outcomes = {doc.name: NodeOutcome(doc.name, doc.status, doc.reason, doc.error)}
        waves_run = [dres[n] for n in self._wave_names]
        values: dict[str, Any] = {}
        for nr in waves_run:
            if nr.status == "ok":
                values.update(nr.value)
        stopped = next((r for r in waves_run if r.status != "ok"), None)
        for b in plan.branches:
            outcomes[b.name] = _branch_outcome(b.name, values.get(b.name), stopped)
        branches = {n: v for n, v in values.items() if isinstance(v, BranchResult)}
        return outcomes, branches

    def close(self) -> None:
        """Close the shared context made by the prefill node, if any."""
        for ctx in self._holder:
            ctx.close()
        self._holder.clear()


def _branch_outcome(name: str, value: Any, stopped: NodeResult | None) -> NodeOutcome:
    if isinstance(value, BranchResult):
        return NodeOutcome(name, "ok")
    if isinstance(value, Skipped):
        return NodeOutcome(name, "skipped", value.reason)
    if isinstance(value, BaseException):
        return NodeOutcome(name, "failed", repr(value), value)
    if stopped is not None:
        return NodeOutcome(name, stopped.status, stopped.reason, stopped.error)
    return NodeOutcome(name, "skipped", "not run: its wave produced no result for it")


Share = Callable[[Plan, Context, list[int], int], None]


def _fork_prefill(
    plan: Plan,
    holder: list[Context],
    seq_of: dict[str, int],
    nctx: NodeContext,
    share: Share,
    streams: bool,
) -> int:
    full = len(plan.doc_tokens)
    n_seq = len(plan.branches) + 1
    if streams:  # each stream as large as a baseline context
        ctx = plan.context(plan.n_ctx * n_seq, n_seq_max=n_seq, kv_unified=False)
    else:
        ctx = plan.context(plan.n_ctx, n_seq_max=n_seq, kv_unified=True)
    holder.append(ctx)
    by_cut: dict[int, list[int]] = {}
    for b in plan.branches:
        by_cut.setdefault(plan.prefix_len(b), []).append(seq_of[b.name])

    def on_chunk(hi: int) -> None:
        if plan.progress:
            plan.progress(hi, full)
        if hi in by_cut and hi != full:
            share(plan, ctx, by_cut[hi], hi)
        nctx.check_cancelled()

    with Batch(plan.base.n_batch) as batch:
        t = time.perf_counter_ns()
        plan.restore_start(ctx, 0)  # the tokens a snapshot holds, if any
        _prefill(ctx, plan.doc_tokens, 0, plan.suffix_bounds(), batch, on_chunk)
        plan.ledger.prefill_done(time.perf_counter_ns() - t)
    share(plan, ctx, by_cut.get(full, []), full)
    return full


def share_prefix(plan: Plan, ctx: Context, seqs: list[int], w: int) -> None:
    """Zero-copy fork: the branch sequences join the first w prefix cells (llama_memory_seq_cp)."""
    t = time.perf_counter_ns()
    for s in seqs:
        if plan.fork.layout == "streams":  # stream 0 holds exactly w tokens right now
            ctx.seq_cp(0, s)
        else:
            ctx.seq_cp(0, s, 0, w)
    plan.ledger.prefix_ready(w, share_ns=(time.perf_counter_ns() - t) // max(len(seqs), 1))


def _fork_wave(
    plan: Plan,
    holder: list[Context],
    seq_of: dict[str, int],
    group: list[BranchNode],
    nctx: NodeContext,
) -> dict[str, BranchResult | BaseException | Skipped]:
    ctx = holder[0]  # created by the prefill node, which this wave runs after
    out: dict[str, BranchResult | BaseException | Skipped] = {}
    prior: dict[str, Any] = {}
    for value in nctx.inputs.values():
        if isinstance(value, dict):
            prior.update(value)
    live: list[tuple[BranchNode, BranchState]] = []
    for b in group:
        bad = [a for a in b.after if a in prior and not isinstance(prior[a], BranchResult)]
        if bad:
            out[b.name] = Skipped(f"upstream {bad[0]} failed")
            ctx.seq_rm(seq_of[b.name])
            continue
        try:
            live.append((b, plan.state(b, seq_of[b.name], prior)))
        except Exception as exc:
            out[b.name] = exc
    t_dec = time.perf_counter_ns()
    run_branch(plan, ctx, [st for _, st in live], nctx)
    for b, st in live:
        try:
            w = plan.prefix_len(b)
            out[b.name] = result_of(
                plan, b, st, plan.ledger.ready_ns(w), t_dec, restore_ms=ms(plan.ledger.share_ns(w))
            )
        except Exception as exc:
            out[b.name] = exc
    return {**prior, **out}
