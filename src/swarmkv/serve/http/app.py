"""The FastAPI app: routes, API keys, the body limit, and errors in OpenAI's shape.

| route                       | what                                                    |
|-----------------------------|---------------------------------------------------------|
| POST /v1/completions        | text completion (string or token-id prompt)             |
| POST /v1/chat/completions   | chat, rendered by llama.cpp's chat template             |
| POST /v1/warm               | a prompt prefilled on every engine (warm.py)            |
| GET /v1/models              | the one model, with its chat template and fingerprint   |
| GET /health                 | 200 while serving, 503 while shutting down (no key)     |
| GET /metrics                | Prometheus text                                         |
| GET /v1/status              | the status page's JSON                                  |
| GET /                       | the status page (the key, if any, goes in the URL hash) |
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message, Receive, Scope, Send

from ...errors import ConfigError, SwarmKVError
from ...llama.chat import ChatTemplate
from ...llama.constraint import Constraint
from ..backend import Backend
from . import openapi
from .complete import CHAT, COMPLETION, DEFAULT_CHAT_MAX_TOKENS, DEFAULT_MAX_TOKENS, Call, Kind
from .errors import APIError, api_error
from .metrics import Metrics
from .schemas import ChatRequest, CompletionRequest, WarmRequest
from .structured import constraint_of, refused
from .warm import warm_every_engine

log = logging.getLogger("swarmkv.serve.http")


@dataclass(frozen=True)
class Settings:
    """What the app serves and how it guards it."""

    model_id: str
    fingerprint: str
    chat_template: ChatTemplate | None
    api_keys: tuple[str, ...] = ()
    prefix_scope: str = "global"  # or "key": reuse only within one API key
    max_body_bytes: int = 8 << 20
    # False behind Ray Serve's proxy, which sends X-Request-ID itself (the id it gave the app)
    request_id_header: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class Gate:
    """Plain ASGI around the app (a BaseHTTPMiddleware would buffer streams and hide client
    disconnects): a request id on every request and response, the count by status, and 413
    for a body over the limit, by its Content-Length or as it streams in."""

    def __init__(self, app: FastAPI, limit: int, metrics: Metrics, tag: bool = True) -> None:
        self.app, self.limit, self.metrics, self.tag = app, limit, metrics, tag
        self.fastapi, self.state = app, app.state

    def openapi(self) -> dict[str, Any]:
        return self.fastapi.openapi()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        rid = headers.get(b"x-request-id", b"").decode("latin-1")[:64] or (
            "req-" + secrets.token_hex(8)
        )
        scope.setdefault("state", {})["request_id"] = rid
        status = {"code": 0, "refused": False}

        async def send_tagged(msg: Message) -> None:
            if status["refused"]:
                return  # our 413 went out instead
            if msg["type"] == "http.response.start":
                status["code"] = msg["status"]
                if self.tag:
                    msg["headers"] = [*msg.get("headers", []), (b"x-request-id", rid.encode())]
            await send(msg)

        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(scope, receive, send_tagged, status)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit and not status["refused"]:
                    await self._refuse(scope, receive, send_tagged, status)
                    return {"type": "http.disconnect"}
            return msg

        try:
            await self.app(scope, limited, send_tagged)
        finally:
            self.metrics.requests.labels(scope.get("path", "?"), str(status["code"])).inc()

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: dict) -> None:
        await _too_large(self.limit)(scope, receive, send)
        status["refused"] = True


def _too_large(limit: int) -> JSONResponse:
    return APIError(
        413, f"the request body exceeds {limit} bytes", code="body_too_large"
    ).response()


def create_app(runtime: Backend, settings: Settings) -> Gate:
    """The server's ASGI app over a running backend: this process's Runtime, or Ray replicas
    (swarmkv.dist.serve_ingress); its lifetime is the caller's."""
    app = FastAPI(title="SwarmKV", version="1", docs_url=None, redoc_url=None)
    metrics = Metrics(runtime.status)
    app.state.runtime, app.state.settings, app.state.metrics = runtime, settings, metrics
    _errors(app)
    openapi.install(app)
    auth = _auth(settings)

    def new_call(kind: Kind, body: Any, tokens: list[int], **kw: Any) -> Call:
        ids = (settings.model_id, settings.fingerprint)
        return Call(kind, runtime, metrics, *ids, body, tokens, **kw)

    @app.post("/v1/completions", response_model=None, responses=openapi.COMPLETION)
    async def completions(
        body: CompletionRequest, request: Request, scope: str | None = Depends(auth)
    ) -> Any:
        _check_model(settings, body.model)
        if body.echo and body.logprobs is not None:
            raise APIError(
                400, "echo with logprobs (prompt logprobs) is not supported", param="echo"
            )
        tokens = _tokens(runtime, body.prompt, "prompt")
        constraint = await _constraint(runtime, body)
        echo = ""
        if body.echo:
            echo = (
                body.prompt
                if isinstance(body.prompt, str)
                else runtime.model.detokenize(list(body.prompt))
            )
        call = new_call(
            COMPLETION, body, tokens, echo=echo, top_logprobs=body.logprobs, constraint=constraint
        )
        return await _run(call, body.max_tokens or DEFAULT_MAX_TOKENS, scope, request, "prompt")

    @app.post("/v1/chat/completions", response_model=None, responses=openapi.COMPLETION)
    async def chat(body: ChatRequest, request: Request, scope: str | None = Depends(auth)) -> Any:
        _check_model(settings, body.model)
        if settings.chat_template is None:
            raise APIError(400, "this server has no chat template", param="messages")
        messages = [{"role": m.role, "content": _content(m.content)} for m in body.messages]
        try:
            text = settings.chat_template.render(messages)
        except SwarmKVError as exc:
            raise api_error(exc, "messages") from exc
        tokens = _tokens(runtime, text, "messages")
        top = (body.top_logprobs or 0) if body.logprobs else None
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        constraint = await _constraint(runtime, body)
        call = new_call(CHAT, body, tokens, top_logprobs=top, constraint=constraint)
        max_tokens = body.max_completion_tokens or body.max_tokens
        # no max_tokens: up to DEFAULT_CHAT_MAX_TOKENS, never past the context (a request
        # reserves its generation room, so "the rest of the context" would run them one by one)
        limit = max(1, min(DEFAULT_CHAT_MAX_TOKENS, runtime.n_ctx - len(tokens)))
        return await _run(call, max_tokens or limit, scope, request, "messages")

    @app.post("/v1/warm", response_model=openapi.WarmAnswer, responses=openapi.WARM)
    async def warm(body: WarmRequest, scope: str | None = Depends(auth)) -> dict[str, Any]:
        _check_model(settings, body.model)
        tokens = _tokens(runtime, body.prompt, "prompt")
        t0 = time.perf_counter()
        try:
            engines = await warm_every_engine(runtime, tokens, scope)
        except SwarmKVError as exc:
            raise api_error(exc, "prompt") from exc
        return {
            "object": "warm",
            "model": settings.model_id,
            "prompt_tokens": len(tokens),
            "ms": round((time.perf_counter() - t0) * 1e3, 1),
            "engines": engines,
        }

    @app.get("/v1/models", responses=openapi.GUARDED)
    async def models(_: str | None = Depends(auth)) -> dict[str, Any]:
        tmpl = settings.chat_template
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "swarmkv",
                    "system_fingerprint": settings.fingerprint,
                    "chat_template": None if tmpl is None else tmpl.name,
                    "n_ctx": runtime.n_ctx,
                    "exact": runtime.config.exact,
                }
            ],
        }

    @app.get("/health", responses=openapi.HEALTH)
    async def health() -> JSONResponse:
        st = runtime.status()
        ok = not runtime.draining
        return JSONResponse(
            {"status": "ok" if ok else "shutting_down", "live": st["live"], "queued": st["queued"]},
            status_code=200 if ok else 503,
        )

    @app.get("/metrics", responses=openapi.METRICS)
    async def prometheus(_: str | None = Depends(auth)) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/status", responses=openapi.GUARDED)
    async def status(_: str | None = Depends(auth)) -> dict[str, Any]:
        out = runtime.status()
        out.update(
            model=settings.model_id,
            fingerprint=settings.fingerprint,
            prefix_scope=settings.prefix_scope,
        )
        return out

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        html = resources.files("swarmkv.serve.http").joinpath("status.html").read_text()
        return HTMLResponse(html)

    return Gate(app, settings.max_body_bytes, metrics, settings.request_id_header)


async def _run(call: Call, max_tokens: int, scope: str | None, request: Request, param: str) -> Any:
    try:
        call.submit(max_tokens, scope)
    except SwarmKVError as exc:
        raise api_error(exc, param) from exc
    if call.body.stream:
        return StreamingResponse(
            call.sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    try:
        answer = await call.answer(lambda: _disconnected(request))
    except SwarmKVError as exc:
        call.cancel()  # the failed choice's siblings
        raise api_error(exc, param) from exc
    if answer is None:  # nobody reads it; 499 (nginx's "client closed request") in /metrics
        return Response(status_code=499)
    return answer


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (its http.disconnect message)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


async def _constraint(runtime: Backend, body: Any) -> Constraint | None:
    """The request's structured-output constraint, checked against the model before it is
    queued (off the event loop: the first constrained request builds llguidance's tokenizer)."""
    found = constraint_of(body)
    if found is None:
        return None
    param, constraint = found
    try:
        await asyncio.to_thread(runtime.prepare_constraint, constraint)
    except ConfigError as exc:
        raise refused(param, f"{param}: {exc}") from exc
    return constraint


def _tokens(runtime: Backend, prompt: Any, param: str) -> list[int]:
    try:
        return runtime.tokenize_prompt(prompt)
    except SwarmKVError as exc:
        raise api_error(exc, param) from exc


def _check_model(settings: Settings, model: str | None) -> None:
    if model not in (None, "", settings.model_id):
        raise APIError(
            400,
            f"unknown model {model!r}; this server serves {settings.model_id!r}",
            param="model",
            code="model_not_found",
        )


def _auth(settings: Settings) -> Any:
    """A dependency: the request's prefix scope, or 401 without a valid key."""
    digests = [hashlib.sha256(k.encode()).digest() for k in settings.api_keys]

    async def check(request: Request) -> str | None:
        if not digests:
            return ""
        header = request.headers.get("authorization", "")
        given = header[7:] if header[:7].lower() == "bearer " else ""
        mine = hashlib.sha256(given.encode()).digest()
        # every key compared, in constant time, whichever matches
        hits = [hmac.compare_digest(mine, d) for d in digests]
        if not any(hits):
            raise APIError(
                401,
                "a valid API key is required (Authorization: Bearer KEY)",
                type="authentication_error",
                code="invalid_api_key",
            )
        if settings.prefix_scope == "key":
            return mine.hex()
        return ""

    return check


def _errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def on_api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":  # its loc is a character position
            error = first.get("ctx", {}).get("error", "")
            pos = first.get("loc", ("body", "?"))[-1]
            msg = f"malformed JSON ({error} at character {pos})"
            return APIError(400, f"invalid request body: {msg}", code="invalid_json").response()
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        msg = first.get("msg", "invalid request")
        where = ".".join(loc)
        text = f"{where}: {msg}" if where else f"invalid request body: {msg}"
        return APIError(400, text, param=where or None, code="invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        headers = dict(exc.headers or {})  # e.g. a 405's Allow
        return APIError(exc.status_code, str(exc.detail), type=kind, headers=headers).response()

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        rid = getattr(request.state, "request_id", "unknown")
        log.error("request %s failed", rid, exc_info=exc)
        return APIError(
            500,
            f"internal error (request id {rid}); the server log has the details",
            type="server_error",
        ).response()
