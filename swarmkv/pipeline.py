"""Pipeline: the short way to prefill a document once and fan it out to branches.

    with Pipeline(model) as p:
        p.prefill("doc", text=document)
        p.branch("summary", prompt="\\nSummary:", n_predict=64)
        p.branch("critic", prompt="\\nCritique of {summary}:", after=["doc", "summary"])
        result = p.run(mode="fork")

Everything is validated (names, cycles, watermarks, prompts, context budget) before any
context or buffer is created.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .budget import BranchNeed, plan_budget
from .concurrency import ConcurrencyPolicy
from .dag import Dag, DagResult
from .decoding import TokenCallback
from .errors import ConfigError, DagError, PipelineError
from .handoff import MODES, ForkOptions, Plan, Skipped, build_baseline, build_fork, build_host
from .llama import Context, ContextConfig, FlashAttn, Model
from .models import default_model_path
from .nodes import BranchNode, PrefillNode
from .pool import HostBufferPool
from .results import BranchResult, NodeOutcome, PipelineResult, ms
from .sampling import SamplerConfig

log = logging.getLogger("swarmkv.pipeline")


@dataclass(frozen=True)
class RunOptions:
    mode: str = "fork"
    timeout_s: float | None = None
    raise_on_failure: bool = True
    keep_logits: bool | str = False


class Pipeline:
    """A document, branches that read it, and settings shared by every context."""

    def __init__(
        self,
        model: Model | str | os.PathLike[str] | None = None,
        *,
        n_ctx: int | None = None,
        n_batch: int = 512,
        n_threads: int | None = None,
        swa_full: bool | None = None,
        flash_attn: FlashAttn = "auto",
        type_k: str = "f16",
        type_v: str = "f16",
        policy: ConcurrencyPolicy | None = None,
        fork: ForkOptions | None = None,
    ) -> None:
        self.fork = fork or ForkOptions()
        self.fork.validate()  # pure checks first: a bad option never loads a model
        self.policy = policy or ConcurrencyPolicy()
        self._own_model = not isinstance(model, Model)
        self._pool: HostBufferPool | None = None
        self.model = model if isinstance(model, Model) else Model(model or default_model_path())
        self.n_ctx = n_ctx
        self.base = ContextConfig(
            n_ctx=n_ctx or min(4096, self.model.n_ctx_train),  # the real size comes from the budget
            n_batch=n_batch,
            n_threads=n_threads,
            swa_full=swa_full,
            flash_attn=flash_attn,
            type_k=type_k,
            type_v=type_v,
        )
        try:
            self.base.validate(self.model)
        except BaseException:
            self.close()
            raise
        self.doc: PrefillNode | None = None
        self.branches: dict[str, BranchNode] = {}

    # -- building ---------------------------------------------------------------------------
    def prefill(
        self, name: str = "doc", *, text: str | None = None, path: str | Path | None = None
    ) -> Pipeline:
        if self.doc is not None:
            raise ConfigError(f"pipeline already has a document {self.doc.name!r}")
        self.doc = PrefillNode.from_source(name, text=text, path=path)
        return self

    def branch(
        self,
        name: str,
        *,
        prompt: str,
        after: str | Iterable[str] | None = None,
        n_predict: int = 64,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        seed: int = 0,
        stop: Iterable[str] = (),
        required_prefix_tokens: int | None = None,
        on_token: TokenCallback | None = None,
    ) -> Pipeline:
        if name in self.branches or (self.doc is not None and name == self.doc.name):
            raise DagError(f"duplicate node name {name!r}")
        deps = (after,) if isinstance(after, str) else tuple(after or ())
        node = BranchNode(
            name,
            prompt,
            deps,
            n_predict,
            SamplerConfig(temperature, top_k, top_p, min_p, seed),
            tuple(stop),
            required_prefix_tokens,
            on_token,
        )
        node.validate()
        self.branches[name] = node
        return self

    # -- validation -------------------------------------------------------------------------
    def _ordered_branches(self) -> list[BranchNode]:
        """Branches in topological order; names, cycles and templates checked (pure Python)."""
        if self.doc is None:
            raise ConfigError("pipeline has no document: call prefill() first")
        if not self.branches:
            raise ConfigError("pipeline has no branches: call branch() at least once")
        shape = Dag()
        shape.add(self.doc.name, lambda n: None)
        for b in self.branches.values():
            shape.add(b.name, lambda n: None, after=b.after or (self.doc.name,))
            for ph in b.placeholders():
                if ph not in b.after or ph not in self.branches:
                    raise ConfigError(
                        f"branch {b.name!r}: prompt uses {{{ph}}}; it must name "
                        "an upstream branch listed in after="
                    )
        order = shape.order()  # validates: unknown names, self-edges, cycles
        return [self.branches[n] for n in order if n in self.branches]

    def _plan(self, opts: RunOptions, t0: int, progress: Callable[[int, int], None] | None) -> Plan:
        if opts.mode not in MODES:
            raise ConfigError(f"unknown mode {opts.mode!r}; choose one of {', '.join(MODES)}")
        branches = self._ordered_branches()
        assert self.doc is not None
        if (
            opts.mode == "fork"
            and self.model.n_swa > 0
            and not self.base.resolved_swa_full(self.model)
        ):
            # forked sequences share every SWA cell, so none can be recycled as the window
            # slides, and a window-sized SWA cache fills up at the first branch token
            raise ConfigError(
                "fork mode needs swa_full=True on a sliding-window model "
                f"(n_swa={self.model.n_swa}); use host mode for swa_full=False"
            )
        doc_tokens = self.doc.tokenize(self.model)
        n_pred = {b.name: b.n_predict for b in branches}
        needs = []
        for b in branches:
            w = b.required_prefix_tokens
            if w is not None and w > len(doc_tokens):
                raise ConfigError(
                    f"branch {b.name!r}: required_prefix_tokens={w} exceeds the "
                    f"document's {len(doc_tokens)} tokens"
                )
            needs.append(
                BranchNeed(
                    b.name,
                    b.estimated_prompt_tokens(self.model, n_pred),
                    b.n_predict,
                    w or len(doc_tokens),
                )
            )
        # fork with per-sequence streams sizes each stream like one branch's own context
        shared = opts.mode == "fork" and self.fork.layout == "unified"
        n_ctx = plan_budget(
            len(doc_tokens),
            needs,
            mode="fork" if shared else "host",
            n_ctx=self.n_ctx,
            n_ctx_train=self.model.n_ctx_train,
        )
        if self._pool is None:
            self._pool = HostBufferPool()
        return Plan(
            self.model,
            self.doc,
            doc_tokens,
            branches,
            self.base,
            n_ctx,
            self._pool,
            self.policy,
            t0,
            self.fork,
            keep_logits=opts.keep_logits,
            progress=progress,
        )

    # -- running ----------------------------------------------------------------------------
    def run(
        self,
        mode: str = "fork",
        *,
        timeout_s: float | None = None,
        raise_on_failure: bool = True,
        keep_logits: bool | str = False,
        progress: Callable[[int, int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> PipelineResult:
        """Run every node; returns per-branch results and pipeline timings (milliseconds).

        keep_logits=True keeps each branch's first-step logits, "all" every step's (for
        fidelity checks; 4 bytes x n_vocab each).
        """
        opts = RunOptions(mode, timeout_s, raise_on_failure, keep_logits)
        t0 = time.perf_counter_ns()
        plan = self._plan(opts, t0, progress)
        holder: list[Context] = []
        try:
            if mode == "fork":
                dag = build_fork(plan, holder)
            else:
                dag = (build_host if mode == "host" else build_baseline)(plan)
            dres = dag.run(timeout_s=timeout_s, cancel=cancel)
        finally:
            for ctx in holder:
                ctx.close()
            plan.release_snapshots()
        result = _collect(plan, opts, dres, time.perf_counter_ns())
        log.info(
            "%s: %d branches, prefill %.1f ms, e2e %.1f ms",
            mode,
            len(result.branches),
            result.prefill_ms,
            result.e2e_ms,
        )
        failures = [o for o in result.outcomes.values() if o.status == "failed"]
        if raise_on_failure and failures:
            _raise_failures(failures)
        return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._own_model:
            self.model.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _raise_failures(failures: list[NodeOutcome]) -> None:
    detail = "; ".join(f"{o.name}: {o.error!r}" for o in failures)
    raise PipelineError(f"{len(failures)} pipeline node(s) failed: {detail}") from failures[0].error


def _outcomes(
    plan: Plan, mode: str, dres: DagResult
) -> tuple[dict[str, NodeOutcome], dict[str, BranchResult]]:
    doc = dres[plan.doc.name]
    outcomes = {doc.name: NodeOutcome(doc.name, doc.status, doc.reason, doc.error)}
    if mode == "fork":
        values = _fork_outcomes(plan, dres, outcomes)
    else:
        values = {}
        for b in plan.branches:
            nr = dres[b.name]
            outcomes[b.name] = NodeOutcome(b.name, nr.status, nr.reason, nr.error)
            values[b.name] = nr.value
    branches = {n: v for n, v in values.items() if isinstance(v, BranchResult)}
    return outcomes, branches


def _fork_outcomes(plan: Plan, dres: DagResult, outcomes: dict[str, NodeOutcome]) -> dict[str, Any]:
    """Per-branch outcomes from the wave nodes; a branch whose wave never delivered a value
    takes that wave's status (the first wave that did not finish ok)."""
    waves = [dres[n] for n in plan.wave_names]
    values: dict[str, Any] = {}
    for nr in waves:
        if nr.status == "ok":
            values.update(nr.value)
    stopped = next((r for r in waves if r.status != "ok"), None)
    for b in plan.branches:
        v = values.get(b.name)
        if isinstance(v, BranchResult):
            outcomes[b.name] = NodeOutcome(b.name, "ok")
        elif isinstance(v, Skipped):
            outcomes[b.name] = NodeOutcome(b.name, "skipped", v.reason)
        elif isinstance(v, BaseException):
            outcomes[b.name] = NodeOutcome(b.name, "failed", repr(v), v)
        elif stopped is not None:
            outcomes[b.name] = NodeOutcome(b.name, stopped.status, stopped.reason, stopped.error)
        else:
            outcomes[b.name] = NodeOutcome(b.name, "skipped")
    return values


def _collect(plan: Plan, opts: RunOptions, dres: DagResult, t_end: int) -> PipelineResult:
    outcomes, branches = _outcomes(plan, opts.mode, dres)
    prefill = statistics.median(plan.prefill_ns) if plan.prefill_ns else 0
    ends = [b.end_ms for b in branches.values()]
    return PipelineResult(
        mode=opts.mode,
        model=plan.model.path.name,
        prefix_tokens=len(plan.doc_tokens),
        n_ctx=plan.n_ctx,
        prefill_ms=ms(int(prefill)),
        snapshot_bytes=plan.snapshot_bytes,
        e2e_ms=max(ends) if ends else ms(t_end - plan.t0_ns),
        branches=branches,
        outcomes=outcomes,
        kv_bytes=plan.kv_bytes,
        decode_stats=plan.stats.to_ms(),
    )
