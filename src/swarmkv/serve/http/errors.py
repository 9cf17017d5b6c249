"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`, one status each."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from ...errors import (
    ClosedError,
    ConfigError,
    ContextLengthError,
    QueueFullError,
    ReplicaError,
    SnapshotMismatchError,
)


class APIError(Exception):
    """An error the HTTP layer answers with its status and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers

    def response(self) -> JSONResponse:
        body = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status, headers=self.headers)

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


def api_error(exc: BaseException, param: str | None = None) -> APIError:
    """The APIError a library error maps to (ConfigError: 400, a full queue: 429, ...)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextLengthError):
        return APIError(400, str(exc), param=param, code="context_length_exceeded")
    if isinstance(exc, QueueFullError):
        return APIError(
            429,
            f"the server is busy: {exc}; retry later",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, ClosedError):
        return APIError(503, str(exc), type="server_error", code="shutting_down")
    if isinstance(exc, ReplicaError):  # a replica died: a retry goes to a live one
        return APIError(
            503,
            f"{exc}; retry the request",
            type="server_error",
            code="replica_failed",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, ConfigError | SnapshotMismatchError):
        return APIError(400, str(exc), param=param)
    raise exc
