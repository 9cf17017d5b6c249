"""The ingress of `swarmkv serve --ray-replicas`: the single server's FastAPI app (the same
routes, schemas, streaming and errors) over engine replicas instead of an engine thread.

The ingress tokenizes (text prompts, and chat messages rendered by the model's chat template),
checks what a Runtime checks before queueing (the vocabulary, a constraint, the context), and
sends each request to the engine deployment as an EngineCall of token ids: the deployment's
request router (prefix_router.py) reads those tokens to pick a replica, which never tokenizes.
The replica's events come back in a stream and go to each choice as a Runtime's would, so
the app cannot tell the two apart (serve/backend.py).

A replica that fails while it holds a request (its process killed, Ray unable to reach it)
ends that request's choices with ReplicaError: a 503 `replica_failed` in OpenAI's shape, or
an error event in a stream that has begun. Other requests are untouched; Serve starts a new
replica, and until then the router sends everything to the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ray import serve

from ..errors import CancelledError, ClosedError, ConfigError, ReplicaError, SwarmKVError
from ..llama.constraint import Constraint
from ..llama.model import Model
from ..llama.models import default_model_path
from ..serve.http.app import Settings, create_app
from ..serve.http.boot import chat_template, fingerprint
from ..serve.job import DoneEvent, ErrorEvent, Job
from ..serve.prompt import check_fits, prepare_constraint, prompt_tokenizer, tokenize_prompt
from ..serve.runtime import ServeConfig
from .router_stats import replica_count, replica_stats
from .serve_engine import EngineCall
from .serve_options import IngressOptions

log = logging.getLogger("swarmkv.dist.serve")

# an engine's counters that add up over replicas (n_ctx: the KV cells of all of them)
SUMMED = (
    "live",
    "queued",
    "idle_cached",
    "pinned",
    "n_ctx",
    "cells_used",
    "cells_shared",
    "prompt_tokens_computed",
    "prompt_tokens_reused",
    "tokens_per_s",
    "finished",
    "evictions",
)
PER_REPLICA = (
    "replica",
    "host",
    "pid",
    "live",
    "queued",
    "pinned",
    "cells_used",
    "finished",
    "prompt_tokens_computed",
    "prompt_tokens_reused",
)


class ReplicaBackend:
    """serve.backend.Backend over the engine deployment's handle (see the module docstring).
    Used on the ingress's event loop only."""

    def __init__(
        self,
        model: Model,
        config: ServeConfig,
        handle: Any,
        n_ctx: int,
        stats: Callable[[], list[dict[str, Any]]],
        replicas: int = 1,
    ) -> None:
        self.model = model
        self._replicas = replicas
        self.config = config
        self._handle = handle.options(stream=True)
        self._n_ctx = n_ctx
        self._stats = stats
        self.tokenizer = prompt_tokenizer(model)
        self._calls: dict[Job, asyncio.Task[None]] = {}
        self._draining = False
        self.in_flight = 0  # choices sent to a replica and not ended
        self.started = time.monotonic()

    @property
    def n_ctx(self) -> int:
        """One replica's KV cells (each request runs on one replica)."""
        return self._n_ctx

    @property
    def engines(self) -> int:
        """The replicas deployed (a call for engine i goes to the i-th live one in id order:
        prefix_router.pinned_replica)."""
        return self._replicas

    @property
    def draining(self) -> bool:
        return self._draining

    def stop_accepting(self) -> None:
        """New requests get ClosedError (503) from now on."""
        self._draining = True

    def tokenize_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        return tokenize_prompt(self.tokenizer, self.model, prompt)

    def prepare_constraint(self, constraint: Constraint) -> None:
        prepare_constraint(self.model, constraint)

    def submit_all(self, jobs: Sequence[Job], engine: int | None = None) -> None:
        """Send a request's jobs to one replica (the router's pick, or the engine-th). Refused
        here as a Runtime refuses what can never fit (any replica's context is as large) and
        everything while shutting down; what only a replica knows (its queue is full) comes
        as each job's error event."""
        if engine is not None and not 0 <= engine < self._replicas:
            raise ConfigError(f"engine {engine} asked of {self._replicas} replicas")
        for job in jobs:
            check_fits(job, self._n_ctx)
        if self._draining:
            raise ClosedError("the server is shutting down")
        jobs = list(jobs)
        task = asyncio.get_running_loop().create_task(self._pump(EngineCall.of(jobs, engine), jobs))
        for job in jobs:
            self._calls[job] = task

    def cancel(self, job: Job) -> None:
        """Cancel the call job belongs to (Serve cancels it on its replica, which cancels
        its jobs there): the app cancels every choice of a request together."""
        task = self._calls.get(job)
        if task is not None:
            task.cancel()

    async def _pump(self, call: EngineCall, jobs: list[Job]) -> None:
        """The replica's events to the jobs; whatever has not ended when the stream does gets
        an error (ReplicaError, or CancelledError when the client went away)."""
        ended = [False] * len(jobs)
        self.in_flight += len(jobs)
        error: SwarmKVError
        try:
            await self._stream(call, jobs, ended)
            error = ReplicaError("the engine replica ended the request without an answer")
        except asyncio.CancelledError:
            error = CancelledError("cancelled: the client went away")
        except Exception as exc:  # Ray's: the replica died, or could not be reached
            reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            log.warning("a replica failed a request: %s: %s", type(exc).__name__, reason)
            error = ReplicaError(f"the engine replica serving this request failed ({reason})")
        finally:
            self.in_flight -= len(jobs)
            for job in jobs:
                self._calls.pop(job, None)
        for i, job in enumerate(jobs):
            if not ended[i]:
                job.on_event(ErrorEvent(error))

    async def _stream(self, call: EngineCall, jobs: list[Job], ended: list[bool]) -> None:
        stream = self._handle.generate.remote(call)
        try:
            async for batch in stream:
                for i, event in batch:
                    if not ended[i]:
                        ended[i] = isinstance(event, DoneEvent | ErrorEvent)
                        jobs[i].on_event(event)
        except asyncio.CancelledError:
            stream.cancel()  # Serve cancels the replica's generator: its jobs are cancelled
            raise

    def status(self) -> dict[str, Any]:
        """The replicas' engine status added up (as of their last routing stats, sent every
        STATS_PERIOD_S), with one entry per replica under `replicas`."""
        reps = sorted(self._stats(), key=lambda r: str(r.get("replica", "")))
        out: dict[str, Any] = {k: sum(r.get(k, 0) for r in reps) for k in SUMMED}
        reused, computed = out["prompt_tokens_reused"], out["prompt_tokens_computed"]
        prefixes = [dict(p, replica=r.get("replica")) for r in reps for p in r.get("prefixes", [])]
        prefixes.sort(key=lambda p: (-p["tokens"], p["start"]))
        out.update(
            cache_hit_rate=reused / (reused + computed) if reused + computed else 0.0,
            tokenizer_tokens_reused=self.tokenizer.reused_tokens,
            prefixes=prefixes[:10],
            uptime_s=time.monotonic() - self.started,
            in_flight=self.in_flight,
            replicas=[{k: r.get(k) for k in PER_REPLICA} for r in reps],
        )
        return out


@serve.ingress()
class Ingress:
    """The ingress deployment's class: serve_replicas.py deploys it with the engine
    deployment's handle. Serve calls `__serve_build_asgi_app__` once the replica is up."""

    def __init__(self, engine: Any, config: ServeConfig, options: IngressOptions) -> None:
        self.engine, self.config, self.options = engine, config, options
        path = Path(options.model_path) if options.model_path else default_model_path()
        self.model_id = path.stem
        # for its tokenizer and chat template only: no context is made, so the weights stay
        # memory-mapped and unread (and never repacked)
        self.model = Model(path)
        self.backend: ReplicaBackend | None = None

    async def __serve_build_asgi_app__(self) -> Any:
        info = await self.engine.info.remote()
        if info["fingerprint"] != self.model.fingerprint:
            raise ConfigError(
                f"the engine replicas loaded another model than the ingress's {self.model_id}"
            )
        opts = self.options
        settings = Settings(
            model_id=self.model_id,
            fingerprint=fingerprint(self.model, self.config.exact),
            chat_template=chat_template(self.model, opts.chat_template),
            api_keys=opts.api_keys,
            prefix_scope=opts.prefix_scope,
            max_body_bytes=opts.max_body_bytes,
            request_id_header=False,  # Serve's proxy sends it, with the id it gave this app
        )
        await _all_replicas_routed(opts.engine, opts.replicas)
        stats = partial(replica_stats, opts.engine)
        self.backend = ReplicaBackend(
            self.model, self.config, self.engine, info["n_ctx"], stats, opts.replicas
        )
        return create_app(self.backend, settings)

    def __del__(self) -> None:
        if self.backend is not None:
            self.backend.stop_accepting()


async def _all_replicas_routed(deployment: str, replicas: int, timeout_s: float = 60.0) -> None:
    """Wait until this process's router knows every engine replica (Serve tells it of them
    one by one after start): until then a call for engine i (a warm-up) would go to another
    replica. Logs and goes on after timeout_s (the route serves with those it knows)."""
    deadline = time.monotonic() + timeout_s
    while replica_count(deployment) < replicas:
        if time.monotonic() > deadline:
            log.warning("the router knows %d of %d replicas", replica_count(deployment), replicas)
            return
        await asyncio.sleep(0.05)
