"""Swarm: a long-lived scheduler serving branches that arrive at any time over shared documents.

    with Swarm(max_live=16, policy="fair") as swarm:
        swarm.add_document("report", text=report)        # prefilled once, on its own sequence
        h = swarm.submit("report", "\\n\\nSummary:", n_predict=32, priority=1)
        for piece in h.stream():                           # tokens as they come
            ...
        print(h.result().activation_ms, swarm.stats().to_dict())

One context with a unified KV cache holds every document and branch; the engine
(engine/core.py, packing "mixed") runs on a worker thread and packs prompt chunks of newly
admitted branches, document chunks and the next token of every live branch into one
llama_batch per step. A full cache queues new branches instead of failing.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from ..checks import check_int, check_name, check_seconds
from ..engine.core import Engine
from ..engine.options import check_branch, check_document_text, check_priority, read_document
from ..engine.policy import Policy, make_policy
from ..engine.result import BranchResult, result_of
from ..engine.sequence import chunk_bounds
from ..engine.work import Document, Request, SeqIds
from ..errors import ClosedError, ConfigError, ContextBudgetError, SwarmKVError, TimeoutError
from ..llama.config import LLAMA_MAX_SEQ, ContextConfig
from ..llama.constraint import Constraint
from ..llama.context import Context
from ..llama.exactness import model_for
from ..llama.guide import check_gbnf
from ..llama.model import Model
from ..llama.sampling import SamplerConfig
from ..process.threads import Worker, wait_all
from .handle import BranchHandle
from .stats import SwarmStats

log = logging.getLogger("swarmkv.swarm")


class Swarm:
    """A branch scheduler over one context (see the module docstring).

    max_live branches decode at once (each a sequence), max_docs documents stay resident;
    n_ctx cells hold the documents plus each live branch's prompt and n_predict tokens.
    exact=None (the default) uses batch-invariant kernels wherever every backend has them
    (llama/exactness.py; `swarm.exact` says which were chosen): every branch then answers
    exactly what a context of its own answers. exact=True insists, exact=False is plain.
    """

    def __init__(
        self,
        model: Model | str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 8192,
        n_batch: int = 512,
        max_live: int = 16,
        max_docs: int = 4,
        n_threads: int | None = None,
        policy: str | Policy = "fair",
        exact: bool | None = None,
    ) -> None:
        self._check_sizes(n_ctx, n_batch, max_live, max_docs)
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._own_model = not isinstance(model, Model)
        self.model, self.exact_choice = model_for(model, exact)
        self.exact = exact = self.exact_choice.exact
        n_seq = max_live + max_docs
        try:
            config = ContextConfig(
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_seq_max=n_seq,
                n_threads=n_threads,
                kv_unified=True,
                batch_invariant=exact,
            )
            self.ctx = Context(self.model, config)
        except BaseException:
            self._close_model()
            raise
        self.max_docs = max_docs
        self.cond = threading.Condition()
        self._engine = Engine(
            self.ctx,
            n_batch=n_batch,
            packing_name="mixed",
            policy=self.policy,
            seq_ids=SeqIds(self.ctx.n_ctx, max_docs, self.ctx.n_seq_max),
            lock=self.cond,
        )
        self._t0 = self._engine.t0_ns
        self._docs: dict[str, Document] = {}
        self._finished: list[Request] = []
        self._seq_no = itertools.count()
        self._closed = False
        self._stopping = False
        self._worker = Worker("swarm-scheduler", self._serve)

    @staticmethod
    def _check_sizes(n_ctx: object, n_batch: object, max_live: object, max_docs: object) -> None:
        """The swarm's numbers, before any model loads: each named when it is wrong."""
        check_int("max_live", max_live, lo=1)
        check_int("max_docs", max_docs, lo=1)
        check_int("n_batch", n_batch, lo=1)
        n = check_int("n_ctx", n_ctx, lo=1)
        assert isinstance(max_live, int) and isinstance(max_docs, int)
        if max_live + max_docs > LLAMA_MAX_SEQ:
            raise ConfigError(
                f"max_live ({max_live}) and max_docs ({max_docs}) must sum to at most "
                f"{LLAMA_MAX_SEQ} sequences (llama.cpp's limit)"
            )
        if n < max_live + 1:
            raise ConfigError(
                f"n_ctx={n} is too small: the swarm's cells must hold a document token and a "
                f"branch's prompt and tokens beside it, for each of max_live={max_live} branches"
            )

    # -- the scheduler thread -----------------------------------------------------------------
    def _serve(self) -> None:
        """Step the engine until close(); every branch left then fails with ClosedError."""
        eng = self._engine
        while True:
            with self.cond:
                while not self._stopping and not eng.busy:
                    self.cond.wait()
                if self._stopping:
                    break
            try:
                eng.step()
            except Exception as exc:  # outside a decode: no one request is to blame
                log.exception("swarm step failed; failing the branches it held")
                eng.abort(SwarmKVError(f"swarm step failed: {exc}"))
            with self.cond:
                self.cond.notify_all()
        eng.abort(ClosedError("the swarm closed before this branch finished"))
        eng.close()

    def _on_finish(self, req: Request, handle: BranchHandle, doc: str) -> None:
        st = req.state
        error = req.error if st is None else st.error
        with self.cond:
            if st is not None:
                self._finished.append(req)
            self.cond.notify_all()
        if error is not None:
            handle._finish(None, error)
        else:
            assert st is not None
            handle._finish(self._result(req, doc), None)

    def _result(self, req: Request, doc: str) -> BranchResult:
        """A finished branch's result: activation and completion from its arrival, first
        token and end from the swarm's start."""
        return result_of(req, ready_ns=req.arrival_ns, t0_ns=self._t0, doc=doc)

    # -- documents ---------------------------------------------------------------------------
    def add_document(
        self,
        name: str,
        *,
        text: str | None = None,
        path: str | Path | None = None,
        wait: bool = True,
        timeout_s: float | None = None,
    ) -> int:
        """Prefill a document on its own sequence (interleaved with running branches);
        returns its token count. wait=False returns at once (branches queue until it is in).
        """
        check_seconds("timeout_s", timeout_s, zero_ok=True)  # before the document is queued
        check_name("document name", name)
        if (text is None) == (path is None):
            raise ConfigError(f"document {name!r}: give exactly one of text= or path=")
        if path is not None:
            text = read_document(name, Path(path))
        text = check_document_text(name, text)
        self._check_open()
        tokens = self.model.tokenize(text, add_special=True)
        ids = self._engine.seq_ids
        assert ids is not None
        with self.cond:
            self._check_open()
            if name in self._docs:
                raise ConfigError(f"document {name!r} is already in the swarm")
            if len(self._docs) >= self.max_docs:
                raise ConfigError(f"the swarm holds max_docs={self.max_docs} documents already")
            if not ids.can_take(len(tokens), "doc"):
                raise ContextBudgetError(
                    f"document {name!r} of {len(tokens)} tokens does not fit: "
                    f"{ids.n_ctx - ids.cells_used} of n_ctx={ids.n_ctx} cells are free"
                )
            seq = ids.take(len(tokens), "doc")
            doc = Document(name, tokens, seq, chunk_bounds(len(tokens), self._engine.n_batch))
            self._docs[name] = doc
            self._engine.add_document(doc)
            self.cond.notify_all()
        if wait:
            self._wait(lambda: not doc.pending, timeout_s, f"document {name!r}")
            if doc.error is not None:
                raise doc.error
        return len(tokens)

    # -- branches ----------------------------------------------------------------------------
    def submit(
        self,
        doc: str,
        prompt: str,
        *,
        n_predict: int = 64,
        name: str | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        seed: int = 0,
        stop: Iterable[str] = (),
        priority: int = 0,
        constraint: Constraint | None = None,
    ) -> BranchHandle:
        """Queue a branch reading document doc; returns its handle at once. constraint:
        what its output must match (swarmkv.Constraint).

        ConfigError for a closed swarm, an unknown document, an empty prompt, n_predict or
        priority not an integer (n_predict >= 1), bad sampler settings or constraint, or a
        branch that could never fit the context.
        """
        self._check_open()
        seq_no = next(self._seq_no)
        label = f"q{seq_no}" if name is None else name
        sampler = SamplerConfig(temperature, top_k, top_p, min_p, seed, constraint)
        stops = tuple(stop) if not isinstance(stop, str) else (stop,)
        # the same checks as a pipeline branch's (name, prompt, n_predict, sampler, stop)
        check_branch(label, prompt, n_predict, sampler, stops)
        check_priority(label, priority)
        if constraint is not None and not constraint.by_llguidance:
            try:
                check_gbnf(self.model, constraint.text)  # llama.cpp's parser, on this thread
            except ConfigError as exc:
                raise ConfigError(f"branch {label!r}: {exc}") from None
        tokens = self.model.tokenize(prompt, add_special=False)
        handle = BranchHandle(label)
        with self.cond:
            self._check_open()
            job = self._docs.get(doc)
            if job is None:
                raise ConfigError(f"unknown document {doc!r}; add_document() it first")
            if job.error is not None:
                raise SwarmKVError(f"document {doc!r} failed: {job.error}") from job.error
            ids = self._engine.seq_ids
            assert ids is not None
            room = ids.n_ctx - sum(len(d.tokens) for d in self._docs.values())
            if len(tokens) + n_predict > room:
                raise ContextBudgetError(
                    f"branch {label!r}: {len(tokens)} prompt + {n_predict} tokens exceed the "
                    f"{room} cells left beside the documents (n_ctx={ids.n_ctx})"
                )
            req = Request(
                label,
                tokens,
                n_predict,
                sampler,
                len(job.tokens),
                doc=job,
                stop=stops,
                on_token=lambda _n, _t, piece: handle._piece(piece),
                priority=priority,
                arrival_s=(time.perf_counter_ns() - self._t0) / 1e9,
                seq_no=seq_no,
            )
            req.on_finish = lambda r: self._on_finish(r, handle, doc)
            self._engine.submit(req)
            self.cond.notify_all()
        return handle

    # -- results and lifetime ----------------------------------------------------------------
    def stats(self) -> SwarmStats:
        """Latency percentiles, fairness and throughput over the branches finished so far."""
        eng = self._engine
        with self.cond:
            done = [
                self._result(r, r.doc.name if r.doc else "")
                for r in self._finished
                if r.state is not None and r.state.error is None
            ]
        wall_s = (time.perf_counter_ns() - self._t0) / 1e9
        return SwarmStats.of(done, eng.tokens_generated, wall_s, eng.steps, eng.decode_ns / 1e6)

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until no branch waits or runs."""
        eng = self._engine
        self._wait(lambda: not eng.waiting and not eng.live, timeout_s, "the swarm to drain")

    def _wait(self, ready: object, timeout_s: float | None, what: str) -> None:
        # a NaN timeout would make Condition.wait return at once, forever: a busy loop
        check_seconds("timeout_s", timeout_s, zero_ok=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.cond:
            while not ready():  # type: ignore[operator]
                self._check_open()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"waited {timeout_s} s for {what}")
                self.cond.wait(left if left is not None else 0.5)

    def _check_open(self) -> None:
        if self._closed or self._stopping:
            raise ClosedError("the swarm is closed")

    def close(self) -> None:
        """Stop the scheduler (unfinished branches fail with ClosedError), free the context,
        and the model if the swarm loaded it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        wait_all([self._worker])
        self.ctx.close()
        self._close_model()

    def _close_model(self) -> None:
        if self._own_model:
            self.model.close()

    def __enter__(self) -> Swarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
