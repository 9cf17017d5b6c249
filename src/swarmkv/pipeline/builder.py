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
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..checks import check_seconds
from ..engine.result import BranchResult, ms
from ..errors import ConfigError, DagError, PipelineError
from ..kv.prefix_source import SnapshotSource
from ..llama.budget import BranchNeed, plan_budget
from ..llama.config import ContextConfig, FlashAttn
from ..llama.constraint import Constraint
from ..llama.exactness import model_for
from ..llama.model import Model
from ..llama.pool import HostBufferPool
from ..llama.sampling import TokenCallback
from .concurrency import ConcurrencyPolicy
from .handoff import Handoff, Plan, make_handoff
from .modes import ForkOptions
from .nodes import BranchNode, PrefillNode
from .results import NodeOutcome, PipelineResult
from .spec import PipelineSpec, check_sequences

if TYPE_CHECKING:
    from ..kv.snapshot import KVSnapshot

log = logging.getLogger("swarmkv.pipeline.builder")


@dataclass(frozen=True)
class RunOptions:
    """The options of one Pipeline.run call (see Pipeline.run)."""

    mode: str = "fork"
    timeout_s: float | None = None
    raise_on_failure: bool = True
    keep_logits: bool | str = False

    def __post_init__(self) -> None:
        check_seconds("timeout_s", self.timeout_s)  # before any planning or tokenizing


class Pipeline:
    """A document, branches that read it, and settings shared by every context.

    exact=None (the default) runs every context batch-invariant (ContextConfig.batch_invariant)
    wherever every backend has such a mode (the CPU's; llama/exactness.py), and plain
    otherwise: `pipeline.exact` and each result's `exact` say which. Batch-invariant, each
    branch's tokens and logits are bit-identical to what a context of its own computes,
    whatever the mode; what it costs against exact=False is measured in
    docs/results/exactness-cost.md. exact=True insists (a ConfigError on a GPU context);
    exact=False uses llama.cpp's fastest kernels (a model given by path is then repacked).
    """

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
        exact: bool | None = None,
    ) -> None:
        self.fork = fork or ForkOptions()
        self.fork.validate()  # pure checks first: a bad option never loads a model
        self.policy = policy or ConcurrencyPolicy()
        self._own_model = not isinstance(model, Model)
        self._pool: HostBufferPool | None = None
        self.model, self.exact_choice = model_for(model, exact)
        self.exact = exact = self.exact_choice.exact
        self.n_ctx = n_ctx
        self.base = ContextConfig(
            n_ctx=n_ctx or min(4096, self.model.n_ctx_train),  # the real size comes from the budget
            n_batch=n_batch,
            n_threads=n_threads,
            swa_full=swa_full,
            flash_attn=flash_attn,
            type_k=type_k,
            type_v=type_v,
            batch_invariant=exact,
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
        self,
        name: str = "doc",
        *,
        text: str | None = None,
        path: str | Path | None = None,
        snapshot: KVSnapshot | str | os.PathLike[str] | None = None,
    ) -> Pipeline:
        """Set the shared document from text= or path=, or start it from a snapshot; returns
        self.

        snapshot= is a KVSnapshot (still yours to release) or a `.swkv` file (mapped shared
        for each run). Alone, the document is the snapshot's tokens and nothing is prefilled;
        with text= or path=, a document that starts with the snapshot's tokens reuses them
        and prefills only the rest (result.reused_tokens says how many).

        Raises ConfigError if the pipeline already has a document, for both text= and path=,
        for no source at all, a missing file or an empty document; SnapshotMismatchError for
        a snapshot of another model or llama.cpp build, or one this pipeline's contexts
        cannot take (checked here, before any run).
        """
        if self.doc is not None:
            raise ConfigError(f"pipeline already has a document {self.doc.name!r}")
        source = None if snapshot is None else SnapshotSource.of(snapshot)
        if source is not None:
            source.check(self.model, self.base.state_settings(self.model))
        self.doc = PrefillNode.from_source(name, text=text, path=path, snapshot=source)
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
        constraint: Constraint | None = None,
    ) -> Pipeline:
        """Add a branch reading the document (and the upstream branches in after=); returns self.

        constraint: what the output must match (`Constraint.json_schema(...)`, `.regex`,
        `.choice`, `.grammar`, `.gbnf`, `.json_object()`), in every mode.

        Raises DagError for a name already used, ConfigError for a bad prompt, n_predict,
        required_prefix_tokens, stop string, sampler setting or constraint (a GBNF grammar
        is parsed by llama.cpp when run() starts, before the prefill); graph checks wait
        for run().
        """
        if name in self.branches or (self.doc is not None and name == self.doc.name):
            raise DagError(f"duplicate node name {name!r}")
        node = BranchNode.from_options(
            name,
            prompt=prompt,
            after=after,
            n_predict=n_predict,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            stop=stop,
            required_prefix_tokens=required_prefix_tokens,
            on_token=on_token,
            constraint=constraint,
        )
        node.validate()
        self.branches[name] = node
        return self

    def snapshot(
        self,
        pool: HostBufferPool | None = None,
        progress: Callable[[int, int], None] | None = None,
        check: Callable[[], None] | None = None,
    ) -> KVSnapshot:
        """Prefill the document once and capture its KV state (save() it to a `.swkv` file).

        The snapshot lives in pool (default: the pipeline's, freed by close()); release() it
        when done. Any pipeline with the same model and context settings can start from it.
        check() runs between prefill chunks and may raise to stop the prefill (its context is
        freed, nothing is captured); by default it is process.interrupt.check, so Ctrl-C in a
        CLI (ctrl_c_sets_flag) stops it with Interrupted, as it stops run().
        """
        if self.doc is None:
            raise ConfigError("the pipeline has no document: call prefill() first")
        from ..engine.snapshot_create import snapshot_tokens
        from ..process.interrupt import check as check_interrupt

        if pool is None:
            if self._pool is None:
                self._pool = HostBufferPool()
            pool = self._pool
        tokens = self.doc.tokenize(self.model)
        return snapshot_tokens(
            self.model, self.base, tokens, pool, progress, check or check_interrupt
        )

    # -- validation -------------------------------------------------------------------------
    def spec(self, mode: str = "fork") -> PipelineSpec:
        """The document and branches as a PipelineSpec (validated by run() before anything)."""
        return PipelineSpec(self.doc, tuple(self.branches.values()), mode)

    def _plan(
        self,
        handoff: Handoff,
        opts: RunOptions,
        t0: int,
        progress: Callable[[int, int], None] | None,
    ) -> Plan:
        """Validate, tokenize and size everything for one run; allocates only the pool."""
        branches = self.spec(opts.mode).validate()
        check_sequences(opts.mode, len(branches), self.base.n_batch)
        handoff.check(self.model, self.base)
        for b in branches:  # a GBNF grammar parsed by llama.cpp, before the prefill
            _check_constraint(self.model, b)
        assert self.doc is not None
        doc_tokens = self.doc.tokenize(self.model)
        reused = _reused(self.doc.snapshot, doc_tokens, handoff, branches)
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
        n_ctx = plan_budget(
            len(doc_tokens),
            needs,
            mode="fork" if handoff.shares_context else "host",
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
            reused=reused,
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
        handoff = make_handoff(mode, self.fork)
        plan = self._plan(handoff, opts, t0, progress)
        owned = None
        if plan.reused:
            assert self.doc is not None and self.doc.snapshot is not None
            plan.start, own = self.doc.snapshot.open()
            owned = plan.start if own else None
        try:
            outcomes, branches = handoff.execute(plan, timeout_s=timeout_s, cancel=cancel)
        finally:  # every thread that used a native handle has ended, on every path: now free
            handoff.close()
            plan.ledger.release_snapshots()
            if owned is not None:
                owned.release()
        # the pipeline's order (as branch() declared them), not the order they finished in:
        # a user zips the results with the inputs, and a Ray run keeps this order too
        branches = {n: branches[n] for n in self.branches if n in branches}
        result = _result(plan, opts, outcomes, branches, time.perf_counter_ns())
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
        """Close the host buffer pool, and the model when the pipeline loaded it itself."""
        if self._pool is not None:
            self._pool.close()
        if self._own_model:
            self.model.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reused(
    source: SnapshotSource | None,
    doc_tokens: list[int],
    handoff: Handoff,
    branches: list[BranchNode],
) -> int:
    """How many document tokens a run restores from the snapshot instead of prefilling."""
    if source is None or not handoff.restores_prefix:
        return 0  # baseline prefills everything itself: it is the reference
    handoff.check_start()
    reused = source.reusable(doc_tokens)
    for b in branches:
        w = b.required_prefix_tokens
        if reused and w is not None and w < reused:
            raise ConfigError(
                f"branch {b.name!r}: required_prefix_tokens={w} ends inside the snapshot's "
                f"{reused} tokens; a branch starting from a snapshot reads at least all of it"
            )
    return reused


def _raise_failures(failures: list[NodeOutcome]) -> None:
    detail = "; ".join(f"{o.name}: {o.error!r}" for o in failures)
    raise PipelineError(f"{len(failures)} pipeline node(s) failed: {detail}") from failures[0].error


def _result(
    plan: Plan,
    opts: RunOptions,
    outcomes: dict[str, NodeOutcome],
    branches: dict[str, BranchResult],
    t_end: int,
) -> PipelineResult:
    prefill = plan.ledger.prefill_median_ns()
    ends = [b.end_ms for b in branches.values()]
    return PipelineResult(
        mode=opts.mode,
        model=plan.model.path.name,
        prefix_tokens=len(plan.doc_tokens),
        reused_tokens=plan.reused,
        n_ctx=plan.n_ctx,
        prefill_ms=ms(prefill),
        snapshot_bytes=plan.ledger.snapshot_bytes,
        e2e_ms=max(ends) if ends else ms(t_end - plan.t0_ns),
        branches=branches,
        outcomes=outcomes,
        kv_bytes=plan.ledger.kv_bytes,
        decode_stats=plan.stats.to_ms(),
        exact=plan.base.batch_invariant,
    )


def _check_constraint(model: Model, branch: BranchNode) -> None:
    from ..llama.guide import check_constraint

    try:
        check_constraint(model, branch.sampler.constraint)
    except ConfigError as exc:
        raise ConfigError(f"branch {branch.name!r}: {exc}") from None
