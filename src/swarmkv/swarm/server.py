"""Swarm: a long-lived scheduler serving branches that arrive at any time over shared documents.

    with Swarm(max_live=16, policy="fair") as swarm:
        swarm.add_document("report", text=report)        # prefilled once, on its own sequence
        h = swarm.submit("report", "\\n\\nSummary:", n_predict=32, priority=1)
        for piece in h.stream():                           # tokens as they come
            ...
        print(h.result().activation_ms, swarm.stats().to_dict())

One context with a unified KV cache holds every document and branch; a scheduler thread
(engine.py) packs prompt chunks of newly admitted branches and the next token of every live
one into one llama_batch per step. A full cache queues new branches instead of failing.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from ..context import Context
from ..context_config import LLAMA_MAX_SEQ, ContextConfig
from ..dag import check_seconds
from ..errors import ConfigError, ContextBudgetError
from ..model import Model
from ..models import default_model_path
from ..nodes import BranchNode
from .engine import Engine
from .handle import BranchHandle
from .policy import Policy, make_policy
from .stats import SwarmStats
from .work import Branch, DocJob


class Swarm:
    """A branch scheduler over one context (see the module docstring).

    max_live branches decode at once (each a sequence), max_docs documents stay resident;
    n_ctx cells hold the documents plus each live branch's prompt and n_predict tokens.
    exact=True (the default) uses batch-invariant kernels: every branch answers exactly what
    a context of its own answers.
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
        exact: bool = True,
    ) -> None:
        n_seq = max_live + max_docs
        if max_live < 1 or max_docs < 1 or n_seq > LLAMA_MAX_SEQ:
            raise ConfigError(
                f"max_live ({max_live}) and max_docs ({max_docs}) must be >= 1 and sum to at "
                f"most {LLAMA_MAX_SEQ} sequences (llama.cpp's limit)"
            )
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._own_model = not isinstance(model, Model)
        self.model = (
            model
            if isinstance(model, Model)
            else Model(model or default_model_path(), repack=not exact)
        )
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
        self._t0 = time.perf_counter_ns()
        self._engine = Engine(self.ctx, self.policy, n_batch, self._t0, max_docs)
        self._seq_no = itertools.count()
        self._thread = threading.Thread(
            target=self._engine.run, name="swarm-scheduler", daemon=True
        )
        self._thread.start()
        self._closed = False

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
        if (text is None) == (path is None):
            raise ConfigError(f"document {name!r}: give exactly one of text= or path=")
        if path is not None:
            from ..nodes import read_document

            text = read_document(name, Path(path))
        assert text is not None
        tokens = self.model.tokenize(text, add_special=True)
        eng = self._engine
        with eng.cond:
            self._check_open()
            if name in eng.docs:
                raise ConfigError(f"document {name!r} is already in the swarm")
            if len(eng.docs) >= self.max_docs:
                raise ConfigError(f"the swarm holds max_docs={self.max_docs} documents already")
            if not eng.ledger.can_take(len(tokens), "doc"):
                raise ContextBudgetError(
                    f"document {name!r} of {len(tokens)} tokens does not fit: "
                    f"{eng.ledger.n_ctx - eng.ledger.cells_used} of n_ctx={eng.ledger.n_ctx} "
                    "cells are free"
                )
            eng.docs[name] = DocJob(name, tokens, eng.ledger.take(len(tokens), "doc"))
            eng.cond.notify_all()
        if wait:
            self._wait(lambda: eng.docs[name].ready, timeout_s, f"document {name!r}")
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
    ) -> BranchHandle:
        """Queue a branch reading document doc; returns its handle at once.

        ConfigError for an unknown document, an empty prompt, n_predict < 1, bad sampler
        settings, or a branch that could never fit the context.
        """
        seq_no = next(self._seq_no)
        label = name or f"q{seq_no}"
        # the same checks as a pipeline branch's (prompt, n_predict, sampler, stop, UTF-8)
        node = BranchNode.from_options(
            label,
            prompt=prompt,
            n_predict=n_predict,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            stop=stop,
        )
        node.validate()
        tokens = self.model.tokenize(prompt, add_special=False)
        eng = self._engine
        with eng.cond:
            self._check_open()
            job = eng.docs.get(doc)
            if job is None:
                raise ConfigError(f"unknown document {doc!r}; add_document() it first")
            room = eng.ledger.n_ctx - sum(len(d.tokens) for d in eng.docs.values())
            if len(tokens) + n_predict > room:
                raise ContextBudgetError(
                    f"branch {label!r}: {len(tokens)} prompt + {n_predict} tokens exceed the "
                    f"{room} cells left beside the documents (n_ctx={eng.ledger.n_ctx})"
                )
            handle = BranchHandle(label)
            arrival = (time.perf_counter_ns() - self._t0) / 1e9
            eng.waiting.append(
                Branch(
                    seq_no,
                    label,
                    doc,
                    tokens,
                    n_predict,
                    node.sampler,
                    node.stop,
                    priority,
                    arrival,
                    handle,
                )
            )
            eng.cond.notify_all()
        return handle

    # -- results and lifetime ----------------------------------------------------------------
    def stats(self) -> SwarmStats:
        """Latency percentiles, fairness and throughput over the branches finished so far."""
        eng = self._engine
        with eng.cond:
            done = [b.result() for b in eng.finished if b.state and b.state.error is None]
        wall_s = (time.perf_counter_ns() - self._t0) / 1e9
        return SwarmStats.of(done, eng.tokens_generated, wall_s, eng.steps, eng.decode_ns / 1e6)

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until no branch waits or runs."""
        eng = self._engine
        self._wait(lambda: not eng.waiting and not eng.live, timeout_s, "the swarm to drain")

    def _wait(self, ready: object, timeout_s: float | None, what: str) -> None:
        # a NaN timeout would make Condition.wait return at once, forever: a busy loop
        check_seconds("timeout_s", timeout_s, zero_ok=True)
        eng = self._engine
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with eng.cond:
            while not ready():  # type: ignore[operator]
                self._check_open()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"waited {timeout_s} s for {what}")
                eng.cond.wait(left if left is not None else 0.5)

    def _check_open(self) -> None:
        if self._closed or self._engine.stopping:
            raise ConfigError("the swarm is closed")

    def close(self) -> None:
        """Stop the scheduler (unfinished branches fail with SwarmClosedError), free the
        context, and the model if the swarm loaded it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._engine.cond:
            self._engine.stopping = True
            self._engine.cond.notify_all()
        self._thread.join()
        self.ctx.close()
        self._close_model()

    def _close_model(self) -> None:
        if self._own_model:
            self.model.close()

    def __enter__(self) -> Swarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
