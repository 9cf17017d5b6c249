"""Handoff modes: how a branch gets the document's KV state. Each builds DAG work from a Plan.

- host (the paper's design): the prefix is exported once into a pool buffer; each branch
  copies it (copy-on-fork), restores it into its own fresh context, and decodes there.
- fork: one context with a unified KV cache; branches share the prefix cells through
  llama_memory_seq_cp (no bytes copied) and decode together, one llama_decode per step.
- baseline: every branch prefills the whole document itself (what SwarmKV eliminates).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .batch import Batch
from .budget import DEFAULT_HEADROOM, round_ctx
from .concurrency import ConcurrencyPolicy
from .dag import Dag, Dep, NodeContext
from .decoding import (
    BranchState,
    DecodeStats,
    chunk_bounds,
    decode_prompts,
    generation_loop,
    new_state,
)
from .decoding import prefill_chunks as _prefill
from .kvmath import estimate_kv_bytes
from .llama import Context, ContextConfig, Model
from .modes import MODES, ForkOptions
from .nodes import BranchNode, PrefillNode
from .pool import HostBufferPool
from .results import BranchResult, ms
from .snapshot import KVSnapshot, capture, restore

__all__ = ["MODES", "ForkOptions", "Plan", "build_baseline", "build_fork", "build_host"]


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
    prefill_ns: list[int] = field(default_factory=list)
    snapshot_bytes: int = 0
    kv_bytes: int | None = None
    ready_ns: dict[int, int] = field(default_factory=dict)  # prefix length -> when available
    share_ns: dict[int, int] = field(default_factory=dict)  # fork: seq_cp time per branch
    snapshots: list[KVSnapshot] = field(default_factory=list)  # host: released after the run
    wave_names: list[str] = field(default_factory=list)  # fork: the DAG nodes that decode

    def release_snapshots(self) -> None:
        for snap in self.snapshots:
            snap.release()
        self.snapshots.clear()

    def prefix_len(self, b: BranchNode) -> int:
        return b.required_prefix_tokens or len(self.doc_tokens)

    def cuts(self) -> list[int]:
        return sorted({self.prefix_len(b) for b in self.branches})

    def bounds(self) -> list[tuple[int, int]]:
        return chunk_bounds(len(self.doc_tokens), self.base.n_batch, self.cuts())

    def context(self, n_ctx: int, **kw: Any) -> Context:
        return Context(self.model, replace(self.base, n_ctx=n_ctx, **kw))

    def upstream_text(self, b: BranchNode, inputs: dict[str, Any]) -> dict[str, str]:
        return {n: inputs[n].text for n in b.placeholders()}

    def state(self, b: BranchNode, seq_id: int, inputs: dict[str, Any]) -> BranchState:
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
    first = st.t_first_ns or st.t_end_ns or time.perf_counter_ns()
    end = st.t_end_ns or time.perf_counter_ns()
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


def _deps(plan: Plan, b: BranchNode) -> list[str | Dep]:
    """The document (at the branch's watermark) plus the upstream branches it names."""
    w = plan.prefix_len(b)
    doc = plan.doc.name if w == len(plan.doc_tokens) else Dep(plan.doc.name, f"prefix:{w}")
    return [doc, *(a for a in b.after if a != plan.doc.name)]


def _prefix_input(plan: Plan, b: BranchNode, inputs: dict[str, Any]) -> Any:
    w = plan.prefix_len(b)
    return (
        inputs[plan.doc.name]
        if w == len(plan.doc_tokens)
        else inputs[f"{plan.doc.name}@prefix:{w}"]
    )


def _run_branch(plan: Plan, ctx: Context, states: list[BranchState], nctx: NodeContext) -> None:
    with Batch(max(plan.base.n_batch, len(states)), 1) as batch:
        decode_prompts(ctx, states, batch, plan.fork.packing, plan.stats, nctx.check_cancelled)
        generation_loop(ctx, states, batch, nctx.check_cancelled, plan.fork.packing, plan.stats)


# -- host ---------------------------------------------------------------------------------
def build_host(plan: Plan) -> Dag:
    dag = Dag()
    dag.add(plan.doc.name, lambda n: _host_prefill(plan, n))
    for b in plan.branches:
        dag.add(b.name, functools.partial(_host_branch, plan, b), after=_deps(plan, b))
    return dag


def _host_prefill(plan: Plan, nctx: NodeContext) -> KVSnapshot:
    toks, full = plan.doc_tokens, len(plan.doc_tokens)
    cuts = set(plan.cuts()) - {full}

    def on_chunk(hi: int) -> None:
        if plan.progress:
            plan.progress(hi, full)
        if hi in cuts:  # a watermark: publish exactly the first hi tokens, keep decoding
            snap = capture(ctx, 0, plan.pool, tuple(toks[:hi]))
            plan.snapshots.append(snap)
            plan.ready_ns[hi] = time.perf_counter_ns()
            nctx.publish(f"prefix:{hi}", snap)
        nctx.check_cancelled()

    with plan.context(round_ctx(full + DEFAULT_HEADROOM)) as ctx, Batch(plan.base.n_batch) as b:
        t = time.perf_counter_ns()
        _prefill(ctx, toks, 0, plan.bounds(), b, on_chunk)
        plan.prefill_ns.append(time.perf_counter_ns() - t)
        snap = capture(ctx, 0, plan.pool, tuple(toks))
        plan.snapshots.append(snap)
    plan.snapshot_bytes = snap.nbytes
    plan.ready_ns[full] = time.perf_counter_ns()
    return snap


def _host_branch(plan: Plan, b: BranchNode, nctx: NodeContext) -> BranchResult:
    snap: KVSnapshot = _prefix_input(plan, b, nctx.inputs)
    available = plan.ready_ns[snap.n_tokens]
    with plan.policy.context_slot():
        nctx.check_cancelled()  # the run may have stopped while this branch waited
        # like the baseline's: a branch may start once its input AND a context slot exist;
        # the wait for the slot is reported separately (wait_ms)
        ready = max(available, time.perf_counter_ns())
        wait_ms = ms(ready - available)
        t = time.perf_counter_ns()
        own = snap.fork(plan.pool)  # copy-on-fork: this branch's private bytes
        copy_ms = ms(time.perf_counter_ns() - t)
        try:
            with plan.context(plan.n_ctx) as ctx:
                restore_ms = restore(ctx, 0, own)
                st = plan.state(b, 0, nctx.inputs)
                t_dec = time.perf_counter_ns()
                _run_branch(plan, ctx, [st], nctx)
        finally:
            own.release()
    return result_of(
        plan, b, st, ready, t_dec, restore_ms=restore_ms, fork_copy_ms=copy_ms, wait_ms=wait_ms
    )


# -- baseline -------------------------------------------------------------------------------
def build_baseline(plan: Plan) -> Dag:
    dag = Dag()
    dag.add(plan.doc.name, lambda n: _baseline_doc(plan))
    for b in plan.branches:
        after = [plan.doc.name, *(a for a in b.after if a != plan.doc.name)]
        dag.add(b.name, functools.partial(_baseline_branch, plan, b), after=after)
    return dag


def _baseline_doc(plan: Plan) -> list[int]:
    plan.ready_ns[len(plan.doc_tokens)] = time.perf_counter_ns()
    return plan.doc_tokens


def _baseline_branch(plan: Plan, b: BranchNode, nctx: NodeContext) -> BranchResult:
    w = plan.prefix_len(b)
    bounds = [(lo, hi) for lo, hi in plan.bounds() if hi <= w]  # the prefill's own chunks
    with plan.policy.context_slot():
        nctx.check_cancelled()  # the run may have stopped while this branch waited
        ready = time.perf_counter_ns()
        with plan.context(plan.n_ctx) as ctx, Batch(plan.base.n_batch) as batch:
            t = time.perf_counter_ns()
            _prefill(ctx, plan.doc_tokens, 0, bounds, batch, lambda _hi: nctx.check_cancelled())
            prefill_ns = time.perf_counter_ns() - t
            plan.prefill_ns.append(prefill_ns)
            st = plan.state(b, 0, nctx.inputs)
            t_dec = time.perf_counter_ns()
            _run_branch(plan, ctx, [st], nctx)
    return result_of(plan, b, st, ready, t_dec, prefill_ms=ms(prefill_ns))


# -- fork -----------------------------------------------------------------------------------
@dataclass
class Skipped:
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


def build_fork(plan: Plan, holder: list[Context]) -> Dag:
    """The shared context lives in `holder` so the pipeline frees it whatever happens."""
    seq_of = {b.name: i + 1 for i, b in enumerate(plan.branches)}
    groups = waves(plan.branches, plan.doc.name)
    dag = Dag()
    dag.add(plan.doc.name, lambda n: _fork_prefill(plan, holder, seq_of, n))
    prev = plan.doc.name
    taken = {plan.doc.name, *seq_of}
    plan.wave_names.clear()
    for k, group in enumerate(groups):
        name = f"wave-{k}"
        while name in taken:  # never the name of a user's document or branch
            name = f"_{name}"
        plan.wave_names.append(name)
        wave = functools.partial(_fork_wave, plan, holder, seq_of, group)
        dag.add(name, wave, after=[prev])
        prev = name
    return dag


def _fork_prefill(
    plan: Plan, holder: list[Context], seq_of: dict[str, int], nctx: NodeContext
) -> int:
    full = len(plan.doc_tokens)
    n_seq = len(plan.branches) + 1
    if plan.fork.layout == "streams":  # each stream as large as a baseline context
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
            _share_prefix(plan, ctx, by_cut[hi], hi)
        nctx.check_cancelled()

    with Batch(plan.base.n_batch) as batch:
        t = time.perf_counter_ns()
        _prefill(ctx, plan.doc_tokens, 0, plan.bounds(), batch, on_chunk)
        plan.prefill_ns.append(time.perf_counter_ns() - t)
    _share_prefix(plan, ctx, by_cut.get(full, []), full)
    return full


def _share_prefix(plan: Plan, ctx: Context, seqs: list[int], w: int) -> None:
    """Zero-copy fork: the branch sequences join the first w prefix cells (llama_memory_seq_cp)."""
    t = time.perf_counter_ns()
    for s in seqs:
        if plan.fork.layout == "streams":  # stream 0 holds exactly w tokens right now
            ctx.seq_cp(0, s)
        else:
            ctx.seq_cp(0, s, 0, w)
    plan.ready_ns[w] = time.perf_counter_ns()
    plan.share_ns[w] = (plan.ready_ns[w] - t) // max(len(seqs), 1)


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
    _run_branch(plan, ctx, [st for _, st in live], nctx)
    for b, st in live:
        try:
            w = plan.prefix_len(b)
            out[b.name] = result_of(
                plan, b, st, plan.ready_ns[w], t_dec, restore_ms=ms(plan.share_ns.get(w, 0))
            )
        except Exception as exc:
            out[b.name] = exc
    plan.kv_bytes = max(plan.kv_bytes or 0, _cells_bytes(plan, [st for _, st in live]))
    return {**prior, **out}


def _cells_bytes(plan: Plan, states: list[BranchState]) -> int:
    cells = len(plan.doc_tokens) + sum(len(s.prompt_tokens) + len(s.tokens) for s in states)
    return estimate_kv_bytes(plan.model, cells, plan.base.type_k, plan.base.type_v)
