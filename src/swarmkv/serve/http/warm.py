"""POST /v1/warm: prefill a prompt on every engine before the requests that share it arrive,
so that none of them waits for that prefill (the head of a fan-out, an agents' system prompt).

Each engine (the single server's one; each replica of `--ray-replicas`) runs the prompt as a
request for one greedy token. The prompt then sits in its prefix cache as any finished
request's does (least recently used first out), and the Ray prefix router records it on every
replica, so the requests that share it spread over all of them by load. A warm-up sent as an
ordinary request reaches one replica only: the router sends a prefix it has seen to the
replica it sent it to before.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import Any

from ...errors import SwarmKVError
from ...llama.sampling import SamplerConfig
from ..backend import Backend
from ..job import DoneEvent, ErrorEvent, Event, Job


async def warm_every_engine(
    runtime: Backend, tokens: list[int], scope: str | None
) -> list[dict[str, Any]]:
    """Prefill tokens on each engine of runtime, one after another; per engine, how many of
    them it already held (cached) and how many it computed. Raises the first refusal or
    error (a SwarmKVError). One at a time because Ray Serve routes a handle's calls by the
    HTTP request's id: two calls of one request in routing at once are mistaken for each other.
    """
    return [await _warm_one(runtime, tokens, scope, e) for e in range(runtime.engines)]


async def _warm_one(
    runtime: Backend, tokens: list[int], scope: str | None, engine: int
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Event] = loop.create_future()
    job = Job(list(tokens), 1, SamplerConfig(), partial(_settle, loop, done), scope=scope)
    runtime.submit_all([job], engine=engine)
    try:
        event = await done
    except BaseException:  # the client went away, or the server is stopping
        runtime.cancel(job)
        raise
    if isinstance(event, ErrorEvent):
        err = event.error
        raise err if isinstance(err, SwarmKVError) else SwarmKVError(str(err))
    assert isinstance(event, DoneEvent)
    return {
        "engine": engine,
        "cached_tokens": event.cached_tokens,
        "computed_tokens": event.prompt_tokens - event.cached_tokens,
    }


def _settle(loop: asyncio.AbstractEventLoop, done: asyncio.Future[Event], event: Event) -> None:
    """A job's event, from whichever thread sends it: the first that ends the job settles it."""
    if isinstance(event, DoneEvent | ErrorEvent):
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_set, done, event)


def _set(done: asyncio.Future[Event], event: Event) -> None:
    if not done.done():
        done.set_result(event)
