"""What the OpenAPI schema says each route answers: the statuses and media types the server
really sends. FastAPI's defaults would document a 422 the server never sends (every
malformed body is a 400 in OpenAI's error shape) and JSON where a stream or Prometheus text
comes back; clients and fuzzers (schemathesis) read this schema, so it must not lie."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error object, the body of every 4xx and 5xx answer."""

    error: ErrorInfo


class WarmedEngine(BaseModel):
    engine: int
    cached_tokens: int  # of the prompt, already held by this engine
    computed_tokens: int  # prefilled now (the last token always: its logits)


class WarmAnswer(BaseModel):
    """POST /v1/warm's answer: the prompt's size and what each engine did with it."""

    object: Literal["warm"]
    model: str
    prompt_tokens: int
    ms: float
    engines: list[WarmedEngine]


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# One server-sent event as OpenAPI 3.1 tools read a text/event-stream schema: a `data:` line
# holding a chunk's JSON, and `data: [DONE]` last.
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string", "minLength": 1}},
}

GUARDED: dict[int | str, dict[str, Any]] = {
    401: _error("no valid API key (only when the server has keys)"),
    500: _error("an unexpected failure; the message names the request id"),
}
COMPLETION: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the answer, or with `stream: true` server-sent events",
        "content": {"text/event-stream": {"schema": SSE_EVENT}},
    },
    400: _error("malformed JSON, a wrong type or value, an unknown model, a prompt too long"),
    413: _error("the body exceeds the server's limit (--max-body)"),
    429: _error("the queue is full; retry after the Retry-After header's seconds"),
    503: _error("the server is shutting down"),
    **GUARDED,
}
WARM: dict[int | str, dict[str, Any]] = {
    400: _error("malformed JSON, a wrong type or value, an unknown model, a prompt too long"),
    413: _error("the body exceeds the server's limit (--max-body)"),
    429: _error("an engine's queue is full; retry after the Retry-After header's seconds"),
    503: _error("the server is shutting down, or a replica failed"),
    **GUARDED,
}
METRICS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    },
    **GUARDED,
}
HEALTH: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "shutting down (the same JSON, status `shutting_down`)",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}
_FASTAPI_ONLY = ("HTTPValidationError", "ValidationError")


def install(app: FastAPI) -> None:
    """Replace app.openapi with FastAPI's schema minus its never-sent 422 answers."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for item in schema["paths"].values():
                for op in item.values():
                    op["responses"].pop("422", None)
                    content = op["responses"].get("200", {}).get("content", {})
                    if "text/plain" in content:  # /metrics: FastAPI adds JSON beside it
                        content.pop("application/json", None)
            for name in _FASTAPI_ONLY:
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
