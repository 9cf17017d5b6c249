"""The server's engine thread: one context, one engine, the prefix cache, and every llama call.

HTTP handlers call `submit`, `cancel` and `status` only: they queue work and read counters
under the runtime's lock, and never touch a native handle. The engine thread loops:

  1. cancellations: a cancelled live request is retired now (its cells freed: seq_rm);
  2. admission, in the policy's order: a request's longest resident prefix is shared with
     seq_cp and only the rest is prefilled; one whose prefix another request is still
     prefilling waits for it; idle sequences are evicted least recently used for room;
  3. one Engine.step(): a llama_decode of every live request's rows (packing "mixed").

A finished request's cells stay resident (prompt + output) for the next turn to reuse.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checks import check_int
from ..engine.core import Engine
from ..engine.policy import make_policy
from ..engine.work import Request
from ..errors import (
    CancelledError,
    ClosedError,
    ConfigError,
    ContextBudgetError,
    ContextLengthError,
    QueueFullError,
    SwarmKVError,
)
from ..llama.config import LLAMA_MAX_SEQ, ContextConfig
from ..llama.constraint import Constraint
from ..llama.context import Context
from ..llama.model import Model
from ..process.threads import Worker, wait_all
from .job import FINISH_REASONS, DoneEvent, ErrorEvent, Job
from .kv_cache import PrefixCache
from .prompt import check_fits, prepare_constraint, prompt_tokenizer, tokenize_prompt

if TYPE_CHECKING:
    from ..kv.snapshot import KVSnapshot

log = logging.getLogger("swarmkv.serve")


@dataclass(frozen=True)
class ServeConfig:
    """The runtime's settings (the `swarmkv serve` flags)."""

    n_ctx: int = 8192
    n_batch: int = 512
    n_threads: int | None = None
    max_live: int = 16
    max_cached: int = 64  # idle sequences kept for reuse
    max_queue: int = 256
    policy: str = "fair"
    exact: bool = True
    snapshots: tuple[Path, ...] = ()

    def check(self) -> None:
        """ConfigError naming the first bad number, before any model loads."""
        check_int("n_ctx", self.n_ctx, lo=16)
        check_int("n_batch", self.n_batch, lo=1)
        check_int("max_live", self.max_live, lo=1)
        check_int("max_cached", self.max_cached, lo=0)
        check_int("max_queue", self.max_queue, lo=1)
        if self.n_seq > LLAMA_MAX_SEQ:
            raise ContextBudgetError(
                f"max_live ({self.max_live}) + max_cached ({self.max_cached}) + snapshots "
                f"({len(self.snapshots)}) exceed llama.cpp's {LLAMA_MAX_SEQ} sequences"
            )
        make_policy(self.policy)

    @property
    def n_seq(self) -> int:
        """Sequence ids: live requests, idle ones kept, and pinned snapshots."""
        return self.max_live + self.max_cached + len(self.snapshots)


class Runtime:
    """The engine thread and what it owns (see the module docstring).

    snapshot_data: the snapshots of config.snapshots already in memory (a Ray replica's, from
    the object store), one per path, restored instead of reading the files; the caller
    releases them once this returns (restore copies them into the context)."""

    def __init__(
        self,
        model: Model,
        config: ServeConfig,
        snapshot_data: Sequence[KVSnapshot] | None = None,
    ) -> None:
        config.check()
        if snapshot_data is not None and len(snapshot_data) != len(config.snapshots):
            raise ConfigError(
                f"{len(snapshot_data)} snapshots given for {len(config.snapshots)} paths"
            )
        self.model = model
        self.config = config
        # text prompts repeat a document: only what follows a shared start is tokenized again
        self.tokenizer = prompt_tokenizer(model)
        ctx_config = ContextConfig(
            n_ctx=config.n_ctx,
            n_batch=config.n_batch,
            n_seq_max=config.n_seq,
            n_threads=config.n_threads,
            kv_unified=True,
            batch_invariant=config.exact,
        )
        self.ctx = Context(model, ctx_config)
        self.cond = threading.Condition()
        try:
            self.cache = PrefixCache(self.ctx, self.ctx.n_ctx, config.n_seq, config.max_live)
            self.engine = Engine(
                self.ctx,
                n_batch=config.n_batch,
                packing_name="mixed",
                policy=make_policy(config.policy),
                lock=self.cond,
            )
            data: Sequence[KVSnapshot | None] = snapshot_data or [None] * len(config.snapshots)
            self.snapshots = [self._pin(p, d) for p, d in zip(config.snapshots, data, strict=True)]
        except BaseException:
            self.ctx.close()
            raise
        self.queue: deque[Job] = deque()
        self._cancels: list[Job] = []
        self._ids = itertools.count()
        self._draining = False
        self._stop = False
        self.finished = 0
        # tokens generated in each whole second of the last 10 s: [second, count]
        self.tokens_out: deque[list[int]] = deque()
        self.started = time.monotonic()
        self._worker = Worker("serve-engine", self._serve)

    def _pin(self, path: Path, given: KVSnapshot | None) -> dict[str, Any]:
        """Restore a snapshot (the file at path, unless given) into a pinned sequence (checked
        against model and context first: SnapshotMismatchError names what differs)."""
        from ..kv.snapshot import KVSnapshot, restore

        snap = KVSnapshot.open_shared(path) if given is None else given
        try:
            seq = self.cache.pin(list(snap.tokens))
            try:
                restore(self.ctx, seq, snap)
            except BaseException:
                self.cache.unpin_failed(seq)
                raise
            log.info("pinned %s: %d tokens on sequence %d", path, snap.n_tokens, seq)
            return {"path": str(path), "tokens": snap.n_tokens, "seq": seq}
        finally:
            if given is None:
                snap.release()

    # -- the HTTP side ------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue job. ContextLengthError when its prompt and max_tokens can never fit,
        QueueFullError when the queue is full, ClosedError while shutting down."""
        check_fits(job, self.ctx.n_ctx)
        with self.cond:
            if self._draining or self._stop:
                raise ClosedError("the server is shutting down")
            if len(self.queue) >= self.config.max_queue:
                raise QueueFullError(f"{len(self.queue)} requests are waiting already")
            job.id = next(self._ids)
            job.req = self._request(job)
            self.queue.append(job)
            self.cond.notify_all()

    def submit_all(self, jobs: Sequence[Job], engine: int | None = None) -> None:
        """Queue a request's jobs (its choices) as submit does, all or none: one refused
        cancels those queued before it, then raises. engine: None or 0 (the only one)."""
        if engine not in (None, 0):
            raise ConfigError(f"engine {engine} asked of a server with one engine")
        queued: list[Job] = []
        try:
            for job in jobs:
                self.submit(job)
                queued.append(job)
        except BaseException:
            for job in queued:
                self.cancel(job)
            raise

    def _request(self, job: Job) -> Request:
        req = Request(
            f"r{job.id}",
            list(job.tokens),
            job.max_tokens,
            job.sampler,
            0,
            stop=job.stop,
            priority=job.priority,
            seq_no=job.id,
            arrival_s=time.monotonic() - self.started,
            keep_cells=True,
            on_row=job.take_row,
        )
        model = self.model

        def on_token(_name: str, token: int, _piece: str) -> None:
            job.on_event(job.token_event(token, model.token_to_piece(token)))
            with self.cond:  # as it is generated, so a stream's tokens count while it runs
                self._count_tokens(1)

        req.on_token = on_token
        req.on_finish = lambda r: self._finished(job, r)
        return req

    def cancel(self, job: Job) -> None:
        """Cancel job (its client went away): its cells are freed within one step."""
        with self.cond:
            self._cancels.append(job)
            self.cond.notify_all()

    # -- the engine thread --------------------------------------------------------------------
    def _serve(self) -> None:
        eng = self.engine
        while True:
            with self.cond:
                while not (self._stop or self.queue or self._cancels or eng.live or eng.waiting):
                    self.cond.wait()
                if self._stop:
                    break
                cancels, self._cancels = self._cancels, []
            for job in cancels:
                self._cancel_now(job)
            with self.cond:
                self._admit()
            if not (eng.live or eng.waiting):
                with self.cond:  # queued work that must wait (never expected): no spin
                    self.cond.wait(0.05)
                continue
            try:
                eng.step()
            except Exception as exc:  # outside a decode: fail what it held, keep serving
                log.exception("engine step failed")
                eng.abort(SwarmKVError(f"engine step failed: {exc}"))
        eng.abort(ClosedError("the server stopped before this request finished"))
        with self.cond:
            queued, self.queue = list(self.queue), deque()
        for job in queued:
            job.on_event(ErrorEvent(ClosedError("the server stopped before this request ran")))
        eng.close()

    def _cancel_now(self, job: Job) -> None:
        with self.cond:
            if job in self.queue:
                self.queue.remove(job)
                queued = True
            else:
                queued = False
        if queued:
            job.on_event(ErrorEvent(CancelledError("cancelled before it started")))
        elif job.req is not None and job.seq is not None:
            self.engine.cancel(job.req, CancelledError("cancelled: the client went away"))

    def _admit(self) -> None:
        """Admit queued jobs in the policy's order while they fit (held: self.cond)."""
        now_s = time.monotonic() - self.started
        by_req = {id(j.req): j for j in self.queue}
        reqs = [j.req for j in self.queue if j.req is not None]
        for waiting in self.engine.policy.admit_order(reqs, now_s):
            job = by_req[id(waiting)]
            plan = self.cache.plan(job.tokens, job.scope)
            if not plan.ready:
                continue  # another request is prefilling this prefix: read it when it is in
            assert job.req is not None
            seq = self.cache.admit(job.tokens, plan, job.max_tokens, job.scope, job.id, job.req)
            if seq is None:
                if not self.engine.live and not self.cache.live:
                    self._refuse(job)
                    continue
                break  # keep the policy's order: nobody overtakes the first that waits
            self.queue.remove(job)
            job.seq, job.cached_tokens = seq, plan.length
            req = job.req
            req.seq_id, req.prefix_len, req.prompt = seq, plan.length, job.tokens[plan.length :]
            self.engine.submit(req)

    def _refuse(self, job: Job) -> None:
        """A job that cannot fit even with the cache emptied of idle sequences."""
        self.queue.remove(job)
        job.on_event(
            ErrorEvent(
                ContextLengthError(
                    f"{len(job.tokens)} prompt + {job.max_tokens} completion tokens do not fit "
                    f"beside the {self.cache.pinned_cells} cells the pinned snapshots hold (n_ctx="
                    f"{self.ctx.n_ctx})"
                )
            )
        )

    def _finished(self, job: Job, req: Request) -> None:
        """The engine retired req (on the engine thread)."""
        st = req.state
        error = req.error if st is None else st.error
        assert job.seq is not None
        with self.cond:
            if st is None:  # never started: the engine did not touch its cells
                self.ctx.seq_rm(job.seq)
            if error is not None:
                self.cache.retire(job.seq, job.id, None, job.scope)
            else:
                assert st is not None
                self.cache.retire(job.seq, job.id, job.tokens + st.decoded, job.scope)
                self.finished += 1
            self.cond.notify_all()
        if error is not None:
            job.on_event(ErrorEvent(error))
            return
        assert st is not None and req.admit_ns is not None
        first = req.token_ns[0] if req.token_ns else None
        job.on_event(
            DoneEvent(
                finish_reason=FINISH_REASONS.get(st.stop_reason or "", "stop"),
                text=st.text,
                completion_tokens=len(st.tokens),
                prompt_tokens=len(job.tokens),
                cached_tokens=job.cached_tokens,
                ttft_ms=None if first is None else (first - req.arrival_ns) / 1e6,
                inter_token_ms=req.inter_token_ms(),
                queue_ms=(req.admit_ns - req.arrival_ns) / 1e6,
            )
        )

    def _count_tokens(self, n: int) -> None:
        second = int(time.monotonic())
        if self.tokens_out and self.tokens_out[-1][0] == second:
            self.tokens_out[-1][1] += n
        else:
            self.tokens_out.append([second, n])
        while self.tokens_out[0][0] < second - 10:
            self.tokens_out.popleft()

    # -- reading and stopping -----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Counters for /metrics and the status page (a consistent view, under the lock)."""
        with self.cond:
            cache = self.cache
            reused, computed = cache.reused_tokens, cache.computed_tokens
            now = time.monotonic()
            recent = sum(n for t, n in self.tokens_out if t >= now - 10.0)  # whole seconds
            return {
                "live": len(cache.live),
                "queued": len(self.queue),
                "idle_cached": len(cache.idle),
                "pinned": len(cache.pinned),
                "n_ctx": self.ctx.n_ctx,
                "cells_used": cache.cells_used,
                "cells_shared": cache.tree.shared_cells(),
                "prompt_tokens_computed": computed,
                "prompt_tokens_reused": reused,
                "tokenizer_tokens_reused": self.tokenizer.reused_tokens,
                "cache_hit_rate": reused / (reused + computed) if reused + computed else 0.0,
                "tokens_per_s": recent / min(10.0, max(now - self.started, 1e-9)),
                "finished": self.finished,
                "evictions": cache.evictions,
                "prefixes": cache.shared_prefixes(),
                "uptime_s": now - self.started,
            }

    def audit(self) -> list[str]:
        """The prefix cache against llama.cpp's cells (PrefixCache.audit), under the lock."""
        with self.cond:
            return self.cache.audit()

    def drain(self, grace_s: float) -> bool:
        """Stop accepting and wait up to grace_s for queued and live requests to end;
        whether they all did."""
        deadline = time.monotonic() + grace_s
        with self.cond:
            self._draining = True
            while self.queue or self.cache.live:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.1))
        return True

    def close(self) -> None:
        """Stop the engine thread (what is left fails with ClosedError) and free the context.
        Idempotent; the model stays the caller's."""
        with self.cond:
            if self._stop:
                return
            self._stop = self._draining = True
            self.cond.notify_all()
        wait_all([self._worker])
        self.ctx.close()

    def stop_accepting(self) -> None:
        """New requests get ClosedError from now on (shutdown has begun)."""
        with self.cond:
            self._draining = True

    @property
    def n_ctx(self) -> int:
        """KV cells in the context, shared by every request."""
        return self.ctx.n_ctx

    @property
    def engines(self) -> int:
        """One engine: this process's."""
        return 1

    @property
    def draining(self) -> bool:
        """Whether the runtime has stopped accepting requests."""
        return self._draining

    @property
    def idle_cells(self) -> int:
        """Cells in use with nothing live or queued: the pinned and idle sequences'."""
        with self.cond:
            return self.cache.cells_used

    def prepare_constraint(self, constraint: Constraint) -> None:
        """ConfigError unless constraint applies to this model (serve.prompt; on the
        caller's thread, like tokenizing: the model is read-only)."""
        prepare_constraint(self.model, constraint)

    def tokenize_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        """A prompt's tokens (serve.prompt.tokenize_prompt)."""
        return tokenize_prompt(self.tokenizer, self.model, prompt)
