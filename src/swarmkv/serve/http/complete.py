"""A completion request from body to answer: its choices submitted to the runtime, then one
JSON answer or a stream of server-sent events, in OpenAI's shapes for both endpoints."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ...llama.constraint import Constraint
from ...llama.sampling import SamplerConfig
from ..backend import Backend
from ..job import DoneEvent, ErrorEvent, Event, Job, TokenEvent
from .errors import api_error
from .metrics import Metrics
from .schemas import MAX_N, Sampling
from .stream import Choice, StopBuffer, collect_tokens

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS = 1024  # chat without max_tokens (bounded by the context too)


@dataclass(frozen=True)
class Kind:
    """What differs between /v1/completions and /v1/chat/completions."""

    chat: bool
    object: str
    chunk_object: str
    id_prefix: str


COMPLETION = Kind(False, "text_completion", "text_completion", "cmpl-")
CHAT = Kind(True, "chat.completion", "chat.completion.chunk", "chatcmpl-")


@dataclass
class Call:
    """One request in flight: its choices and how to answer."""

    kind: Kind
    runtime: Backend
    metrics: Metrics
    model_id: str
    fingerprint: str
    body: Sampling
    tokens: list[int]
    echo: str = ""
    top_logprobs: int | None = None
    constraint: Constraint | None = None  # every choice's (serve.http.structured)

    def __post_init__(self) -> None:
        self.id = self.kind.id_prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.choices: list[Choice] = []
        self.jobs: list[Job] = []

    # -- submission ---------------------------------------------------------------------------
    def submit(self, max_tokens: int, scope: str | None) -> None:
        """Queue n jobs, all or none; the first's prompt prefill is shared by the others (an
        engine makes them wait for it, and a Ray ingress sends them to one replica together).
        Choice i samples with seed + i."""
        body = self.body
        seed = body.seed if body.seed is not None else secrets.randbelow(2**32 - MAX_N)
        stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        loop = asyncio.get_running_loop()
        choices, jobs = [], []
        for i in range(body.n):
            choice = Choice(i, loop)
            sampler = SamplerConfig(
                body.temperature,
                body.top_k,
                None if body.top_p >= 1.0 else body.top_p,
                body.min_p,
                (seed + i) % 2**32,
                constraint=self.constraint,
            )
            sampler.validate()
            job = Job(
                self.tokens,
                max_tokens,
                sampler,
                choice.push,
                stop=stops,
                scope=scope,
                priority=body.priority,
                top_logprobs=self.top_logprobs,
            )
            choices.append(choice)
            jobs.append(job)
        self.runtime.submit_all(jobs)
        self.choices, self.jobs = choices, jobs

    def cancel(self) -> None:
        """Cancel every choice still running (the client went away, or a sibling failed)."""
        for job, choice in zip(self.jobs, self.choices, strict=True):
            if not choice.ended:
                self.runtime.cancel(job)

    # -- one JSON answer ----------------------------------------------------------------------
    async def answer(self, disconnected: Callable[[], Any]) -> dict[str, Any] | None:
        """Wait for every choice. None if the client disconnects first: every choice is
        cancelled and nobody is left to answer."""
        gather = asyncio.ensure_future(asyncio.gather(*(self._events(c) for c in self.choices)))
        watch = asyncio.ensure_future(disconnected())
        try:
            done, _ = await asyncio.wait({gather, watch}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the handler itself was cancelled (the server stopping)
            self._abandon(gather)
            raise
        finally:
            watch.cancel()
        if gather not in done:
            self._abandon(gather)
            return None
        results = gather.result()
        out, usage = [], None
        for choice, events in zip(self.choices, results, strict=True):
            tokens, end = collect_tokens(events)
            self.metrics.observe(end.ttft_ms, end.inter_token_ms)
            out.append(self._choice(choice.index, self.echo + end.text, tokens, end))
            usage = self._usage(end, usage)
        return {
            "id": self.id,
            "object": self.kind.object,
            "created": self.created,
            "model": self.model_id,
            "system_fingerprint": self.fingerprint,
            "choices": out,
            "usage": usage,
        }

    def _abandon(self, gather: asyncio.Future[Any]) -> None:
        gather.cancel()
        # retrieve its outcome, so asyncio logs no "exception was never retrieved"
        gather.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.cancel()

    @staticmethod
    async def _events(choice: Choice) -> list[Event]:
        return [e async for e in choice.stream()]

    def _choice(
        self, index: int, text: str, tokens: list[TokenEvent], end: DoneEvent
    ) -> dict[str, Any]:
        logprobs = self._logprobs(tokens) if self.top_logprobs is not None else None
        if self.kind.chat:
            return {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": end.finish_reason,
            }
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": end.finish_reason,
        }

    def _usage(self, end: DoneEvent, before: dict[str, Any] | None) -> dict[str, Any]:
        """Prompt tokens once, completion tokens summed over the choices; cached_tokens:
        the first choice's prompt tokens read from the prefix cache."""
        if before is None:
            before = {
                "prompt_tokens": end.prompt_tokens,
                "completion_tokens": 0,
                "total_tokens": 0,
                "prompt_tokens_details": {"cached_tokens": end.cached_tokens},
            }
        before["completion_tokens"] += end.completion_tokens
        before["total_tokens"] = before["prompt_tokens"] + before["completion_tokens"]
        return before

    # -- logprobs -----------------------------------------------------------------------------
    def _piece(self, token: int) -> str:
        return self.runtime.model.token_to_piece(token).decode("utf-8", errors="replace")

    def _logprobs(self, tokens: list[TokenEvent]) -> dict[str, Any]:
        if self.kind.chat:
            return {"content": [self._chat_lp(t) for t in tokens]}
        offset, text_offset = len(self.echo), []
        for t in tokens:
            text_offset.append(offset)
            offset += len(t.text)
        return {
            "tokens": [self._piece(t.token) for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{self._piece(i): lp for i, lp in t.top} for t in tokens],
            "text_offset": text_offset,
        }

    def _chat_lp(self, t: TokenEvent) -> dict[str, Any]:
        def entry(token: int, lp: float | None) -> dict[str, Any]:
            raw = self.runtime.model.token_to_piece(token)
            return {
                "token": raw.decode("utf-8", errors="replace"),
                "logprob": lp,
                "bytes": list(raw),
            }

        out = entry(t.token, t.logprob)
        out["top_logprobs"] = [entry(i, lp) for i, lp in t.top]
        return out

    # -- a stream of events -------------------------------------------------------------------
    async def sse(self) -> AsyncIterator[bytes]:
        """Server-sent events, choices interleaved as their tokens come; `data: [DONE]` last.
        A disconnect (the task cancelled) cancels every choice still running."""
        queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        pumps = [asyncio.ensure_future(self._pump(c, queue)) for c in self.choices]
        buffers = [StopBuffer(self.jobs[0].stop) for _ in self.choices]
        usage: dict[str, Any] | None = None
        try:
            if self.kind.chat:
                for c in self.choices:
                    yield self._chunk(c.index, {"role": "assistant", "content": ""}, None, None)
            elif self.echo:
                for c in self.choices:
                    yield self._chunk(c.index, self.echo, None, None)
            for _ in self.choices:
                while True:
                    index, event = await queue.get()
                    if isinstance(event, TokenEvent):
                        text = buffers[index].feed(event.text)
                        lp = self._logprobs([event]) if self.top_logprobs is not None else None
                        yield self._chunk(index, self._delta(text), lp, None)
                        continue
                    if isinstance(event, ErrorEvent):
                        yield _data({"error": api_error_body(event.error)})
                        break
                    assert isinstance(event, DoneEvent)
                    self.metrics.observe(event.ttft_ms, event.inter_token_ms)
                    rest = buffers[index].finish(event.text)
                    yield self._chunk(index, self._delta(rest), None, event.finish_reason)
                    usage = self._usage(event, usage)
                    break
            opts = self.body.stream_options
            if opts is not None and opts.include_usage:
                yield _data(
                    {
                        "id": self.id,
                        "object": self.kind.chunk_object,
                        "created": self.created,
                        "model": self.model_id,
                        "system_fingerprint": self.fingerprint,
                        "choices": [],
                        "usage": usage,
                    }
                )
            yield b"data: [DONE]\n\n"
        finally:
            for p in pumps:
                p.cancel()
            self.cancel()

    @staticmethod
    async def _pump(choice: Choice, queue: asyncio.Queue[tuple[int, Event]]) -> None:
        async for event in choice.stream():
            queue.put_nowait((choice.index, event))

    def _delta(self, text: str) -> Any:
        return {"content": text} if self.kind.chat else text

    def _chunk(self, index: int, delta: Any, logprobs: Any, finish: str | None) -> bytes:
        key = "delta" if self.kind.chat else "text"
        choice = {"index": index, key: delta, "logprobs": logprobs, "finish_reason": finish}
        return _data(
            {
                "id": self.id,
                "object": self.kind.chunk_object,
                "created": self.created,
                "model": self.model_id,
                "system_fingerprint": self.fingerprint,
                "choices": [choice],
            }
        )


def api_error_body(exc: BaseException) -> dict[str, Any]:
    """The OpenAI error body for a failure after the stream started (status already sent)."""
    try:
        return api_error(exc).to_dict()
    except BaseException:
        return {
            "message": f"the request failed: {type(exc).__name__}",
            "type": "server_error",
            "param": None,
            "code": None,
        }


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
