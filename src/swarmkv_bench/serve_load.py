"""The load generator of `swarmkv bench --serve`: one asyncio task per agent, the official
`openai` async client, streaming completions at temperature 0, against any OpenAI-compatible
endpoint. Every request is recorded on the client's clock (ms from the moment it was sent).

A multi-turn agent sends its next turn when the previous answer has arrived, its prompt the
whole history so far (serve_workloads says how it is built).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .serve_workloads import AgentPlan, Workload


@dataclass
class Request:
    """One request as its client saw it: times in ms from when it was sent (`sent_s`: seconds
    from the first arrival), the server's token counts where it reports them."""

    agent: int
    turn: int
    group: int
    sent_s: float = 0.0
    prompt: str = ""
    text: str = ""
    ttft_ms: float | None = None
    gaps_ms: list[float] = field(default_factory=list)
    done_ms: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None

    def record(self) -> dict[str, Any]:
        """What the result file keeps (the prompt's text aside: its tokens are there)."""
        return {k: v for k, v in self.__dict__.items() if k != "prompt"}


async def send(client: Any, model: str, req: Request, n_predict: int) -> Request:
    """Stream one completion into req; an error is recorded, never raised (a run counts
    errors, it does not stop)."""
    stamps: list[float] = []
    t = time.perf_counter()
    try:
        stream = await client.completions.create(
            model=model,
            prompt=req.prompt,
            max_tokens=n_predict,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                stamps.append(time.perf_counter())
                req.text += chunk.choices[0].text
            if chunk.usage is not None:
                _usage(req, chunk.usage)
    except Exception as exc:
        req.error = f"{type(exc).__name__}: {exc}"
        return req
    if stamps:
        req.ttft_ms = (stamps[0] - t) * 1e3
        req.gaps_ms = [(b - a) * 1e3 for a, b in itertools.pairwise(stamps)]
    req.done_ms = (time.perf_counter() - t) * 1e3
    req.completion_tokens = req.completion_tokens or len(stamps)
    return req


def _usage(req: Request, usage: Any) -> None:
    req.completion_tokens = usage.completion_tokens
    req.prompt_tokens = usage.prompt_tokens
    details = getattr(usage, "prompt_tokens_details", None)
    req.cached_tokens = getattr(details, "cached_tokens", None) if details is not None else None


def client_for(v1: str, timeout_s: float = 3600) -> Any:
    """The official async client without retries (a failure counts), and without keeping
    connections: llama-server (cpp-httplib) can close one as a streamed answer ends while the
    pool hands it to the agent's next turn, which then fails before the server sees it (1 to
    4 of 12 multi-turn requests a run with a pool, none without). A fresh loopback connection
    per request costs every system the same."""
    import importlib

    import openai

    # httpx, or httpx2 in newer openai releases: Limits from the package its client is built on
    base = openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0]
    limits = importlib.import_module(base).Limits(max_keepalive_connections=0)
    fresh = openai.DefaultAsyncHttpxClient(limits=limits)
    return openai.AsyncOpenAI(
        base_url=v1, api_key="bench", max_retries=0, timeout=timeout_s, http_client=fresh
    )


async def run_load(
    v1: str, work: Workload, arrivals: Sequence[float]
) -> tuple[list[Request], float]:
    """Every agent at its arrival time, each its own task, its turns in order; returns the
    requests (by agent, then turn) and the wall time from the first arrival to the last
    answer (s)."""
    client = client_for(v1)
    model = (await client.models.list()).data[0].id
    t0 = time.perf_counter() + 0.2

    async def agent(plan: AgentPlan, t_s: float) -> list[Request]:
        await asyncio.sleep(max(0.0, t0 + t_s - time.perf_counter()))
        history, out = plan.head, []
        for turn, q in enumerate(plan.questions):
            req = Request(plan.index, turn, plan.group, time.perf_counter() - t0, history + q)
            await send(client, model, req, work.n_predict)
            out.append(req)
            if req.error is not None:  # the history is gone: the agent's later turns fail too
                break
            history = req.prompt + req.text
        return out

    per_agent = await asyncio.gather(
        *(agent(p, t) for p, t in zip(work.agents, arrivals, strict=True))
    )
    await client.close()
    reqs = [r for rs in per_agent for r in rs]
    ends = [r.sent_s + r.done_ms / 1e3 for r in reqs if r.done_ms is not None]
    return reqs, (max(ends) if ends else 0.0) - min(arrivals)


async def run_alone(v1: str, prompts: Sequence[str], n_predict: int) -> list[Request]:
    """Each prompt again, one at a time, on the same server: what it answers alone, and how
    long one request takes there with nothing else running (the basis of slowdown)."""
    client = client_for(v1, 600)
    model = (await client.models.list()).data[0].id
    out = []
    for i, prompt in enumerate(prompts):
        out.append(await send(client, model, Request(i, 0, 0, prompt=prompt), n_predict))
    await client.close()
    return out


async def warm_every_engine(v1: str, heads: Sequence[str]) -> list[dict[str, Any]]:
    """swarmkv's own warm-up (POST /v1/warm): each head prefilled on every engine, a Ray
    deployment's every replica included (an ordinary request reaches one replica: the router
    sends a prefix it has seen where it sent it). With no heads, one short prompt. Returns
    the answers."""
    client = client_for(v1, 600)
    out = []
    try:
        for text in heads or ["Hello"]:
            answer = await client.post("/warm", body={"prompt": text}, cast_to=object)
            out.append(answer)
    finally:
        await client.close()
    return out


async def replica_split(v1: str, warmed: int, timed: int, wait_s: float = 15.0) -> list[int]:
    """Requests each replica of a Ray deployment finished under load (its `warmed` warm-ups
    left out), in /v1/status's replica order, once the replicas' reports (each lags up to a
    second) add up to the `timed` requests; RuntimeError if they never do."""
    client = client_for(v1, 60)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            status = await client.get("/status", cast_to=object)
            done = [int(r["finished"]) - warmed for r in status["replicas"]]
            if sum(done) >= timed:
                return done
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replicas report {done} requests of {timed}")
            await asyncio.sleep(0.5)
    finally:
        await client.close()


async def warm(v1: str, heads: Sequence[str], copies: int) -> None:
    """Each head `copies` times at once (max_tokens 1), before the clock starts: every slot
    of a multi-slot server then holds a head. With no heads (the cold workload) one short
    request, so that no system's first timed request pays for paging the weights in."""
    client = client_for(v1, 600)
    model = (await client.models.list()).data[0].id
    texts = [h for h in heads for _ in range(copies)] or ["Hello"]
    reqs = [Request(-1, 0, 0, prompt=t) for t in texts]
    await asyncio.gather(*(send(client, model, r, 1) for r in reqs))
    await client.close()
    failed = [r.error for r in reqs if r.error is not None]
    if failed:
        raise RuntimeError(f"warming {v1} failed: {failed[0]}")
