"""What the HTTP layer needs of the engines behind it, and nothing more.

Two classes provide it: the single server's Runtime (runtime.py: one engine thread in this
process) and the Ray ingress's ReplicaBackend (swarmkv.dist.serve_ingress: engines in Ray Serve
replicas, reached through a deployment handle). The app, its schemas and its answers are the
same code over either, so the two serve the same routes with the same shapes and errors.

| member             | what                                                                |
|--------------------|---------------------------------------------------------------------|
| model              | read only: token pieces for logprobs, echo's text                   |
| config             | the engines' settings (`exact` for /v1/models)                      |
| n_ctx              | KV cells of one engine's context: a request must fit in it          |
| engines            | how many engines serve (Ray replicas; 1 for a Runtime)              |
| tokenize_prompt    | text or token ids to the ids an engine continues                    |
| prepare_constraint | ConfigError unless a structured-output constraint applies           |
| submit_all         | queue a request's choices (one Job each), all or none; raises its refusal; |
|                    | `engine` (0 .. engines-1) sends them to that engine, not the router's pick |
| cancel             | cancel a job (its client went away, or a sibling failed)            |
| status             | the counters of /metrics, /health and the status page               |
| draining           | whether new requests are refused (shutting down)                    |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..llama.constraint import Constraint
    from ..llama.model import Model
    from .job import Job
    from .runtime import ServeConfig


class Backend(Protocol):
    """The engines behind the HTTP layer (see the module table)."""

    model: Model
    config: ServeConfig

    @property
    def n_ctx(self) -> int: ...

    @property
    def engines(self) -> int: ...

    @property
    def draining(self) -> bool: ...

    def tokenize_prompt(self, prompt: str | Sequence[int]) -> list[int]: ...

    def prepare_constraint(self, constraint: Constraint) -> None: ...

    def submit_all(self, jobs: Sequence[Job], engine: int | None = None) -> None: ...

    def cancel(self, job: Job) -> None: ...

    def status(self) -> dict[str, Any]: ...
