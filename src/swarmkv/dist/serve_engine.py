"""One engine replica of `swarmkv serve --ray-replicas`: the single server's Runtime (its engine
thread, prefix cache and scheduler, unchanged) inside a Ray Serve replica.

Plain Python: serve_replicas.py makes it a deployment. The ingress (serve_ingress.py) sends each
request as an EngineCall, token ids and all of its choices' samplers, so that the router can
read its tokens and the replica never tokenizes; `generate` streams its jobs' events back in
batches of (choice index, event), as they come.

| method               | who calls it           | what                                           |
|----------------------|------------------------|------------------------------------------------|
| generate             | the ingress, streaming | submit the call's jobs, stream their events    |
| info                 | the ingress, at start  | n_ctx and the model's fingerprint              |
| record_routing_stats | Serve, periodically    | the engine's status (the ingress's /v1/status) |
| __del__              | Serve, at shutdown     | after Serve's graceful wait: stop the engine   |
|                      |                        | thread, free the context and the model         |
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SwarmKVError
from ..llama.model import Model
from ..llama.models import default_model_path
from ..llama.sampling import SamplerConfig
from ..serve.job import DoneEvent, ErrorEvent, Event, Job
from ..serve.runtime import Runtime, ServeConfig
from .payload import snapshot_from_payload

if TYPE_CHECKING:
    from ..kv.snapshot import KVSnapshot

log = logging.getLogger("swarmkv.dist.serve")

Batch = list[tuple[int, Event]]


@dataclass(frozen=True)
class EngineCall:
    """One request as a replica receives it: its prompt as token ids (the router reads them;
    the replica never tokenizes), and one sampler per choice; the rest as in Job. replica:
    None, or the index (in id order) of the replica the router must send it to (a warm-up
    that reaches every replica: serve.http.warm)."""

    tokens: tuple[int, ...]
    max_tokens: int
    samplers: tuple[SamplerConfig, ...]
    stop: tuple[str, ...] = ()
    scope: str | None = ""
    priority: int = 0
    top_logprobs: int | None = None
    replica: int | None = None

    @classmethod
    def of(cls, jobs: Sequence[Job], replica: int | None = None) -> EngineCall:
        """The call of a request's jobs (its choices share everything but the sampler)."""
        j = jobs[0]
        samplers = tuple(job.sampler for job in jobs)
        return cls(
            tuple(j.tokens),
            j.max_tokens,
            samplers,
            j.stop,
            j.scope,
            j.priority,
            j.top_logprobs,
            replica,
        )


class EngineReplica:
    """A Runtime in a Serve replica (see the module table).

    model_path None: the default model, found on this replica's node. snapshot_refs: one Ray
    ObjectRef per config.snapshots path, of a payload.snapshot_payload the driver put once;
    each is restored from the object store (no replica reads the files)."""

    def __init__(self, model_path: str | None, config: ServeConfig, snapshot_refs: list[Any]):
        path = Path(model_path) if model_path is not None else default_model_path()
        # batch-invariant contexts keep the GGUF layout (see Model: repack=not exact)
        self.model = Model(path, repack=not config.exact)
        snaps: list[KVSnapshot] = []
        try:
            snaps = _snapshots(snapshot_refs)
            self.runtime = Runtime(self.model, config, snaps)
        except BaseException:
            self.model.close()
            raise
        finally:
            for snap in snaps:  # restored: the context holds its own copy
                snap.release()
        self.name = _replica_name()
        log.info("replica %s: %s, n_ctx %d", self.name, path.name, self.runtime.n_ctx)

    def info(self) -> dict[str, Any]:
        """What the ingress checks against its own model, and its context size."""
        return {
            "replica": self.name,
            "fingerprint": self.model.fingerprint,
            "n_ctx": self.runtime.n_ctx,
            "exact": self.runtime.config.exact,
        }

    async def generate(self, call: EngineCall) -> AsyncIterator[Batch]:
        """Submit call's jobs; yield their events as they come, until each has ended. A
        refusal (a full queue, shutting down) is every choice's error. Cancelled (the
        ingress's client went away): the jobs still running are cancelled."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        jobs = [
            Job(
                list(call.tokens),
                call.max_tokens,
                sampler,
                partial(_hop, loop, events, i),
                stop=call.stop,
                scope=call.scope,
                priority=call.priority,
                top_logprobs=call.top_logprobs,
            )
            for i, sampler in enumerate(call.samplers)
        ]
        try:
            self.runtime.submit_all(jobs)
        except SwarmKVError as exc:
            yield [(i, ErrorEvent(_portable(exc))) for i in range(len(jobs))]
            return
        left = len(jobs)
        try:
            while left:
                batch = [await events.get()]
                while not events.empty():  # what came meanwhile goes in one message
                    batch.append(events.get_nowait())
                left -= sum(isinstance(e, DoneEvent | ErrorEvent) for _, e in batch)
                yield [(i, _portable_event(e)) for i, e in batch]
        finally:
            if left:
                for job in jobs:
                    self.runtime.cancel(job)

    def record_routing_stats(self) -> dict[str, Any]:
        """The engine's status (Serve hands it to the routers: the ingress's /v1/status)."""
        status = self.runtime.status()
        status.update(replica=self.name, host=socket.gethostname(), pid=os.getpid())
        return status

    def __del__(self) -> None:
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.close()
            self.model.close()


def _snapshots(refs: list[Any]) -> list[KVSnapshot]:
    """The KV snapshots of refs, zero-copy views of the object store (checksums verified)."""
    if not refs:
        return []
    import ray  # a replica is a Ray process: ray is there

    return [snapshot_from_payload(payload) for payload in ray.get(list(refs))]


def _replica_name() -> str:
    """This replica's full id (the routers' name for it), or the pid outside Serve."""
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.to_full_id_str())
    except Exception:  # not in a replica (a test calling it directly)
        return f"pid-{os.getpid()}"


def _hop(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any], i: int, e: Event) -> None:
    """From the engine thread onto the replica's event loop."""
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
        loop.call_soon_threadsafe(queue.put_nowait, (i, e))


def _portable(exc: BaseException) -> BaseException:
    """exc if it pickles (to cross to the ingress as itself), else a SwarmKVError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return SwarmKVError(f"{type(exc).__name__}: {exc}")


def _portable_event(event: Event) -> Event:
    if isinstance(event, ErrorEvent):
        return replace(event, error=_portable(event.error))
    return event
