"""One exception family for everything SwarmKV raises on purpose.

Messages carry the numbers involved, so a user can act without a debugger.
"""

from __future__ import annotations

import builtins


class SwarmKVError(Exception):
    """Base class of every error SwarmKV raises deliberately."""


class ConfigError(SwarmKVError, ValueError):
    """A parameter or input is invalid; raised before any native call."""


class ModelLoadError(SwarmKVError):
    """A model file is missing, not GGUF, truncated, or rejected by llama.cpp."""


class ContextCreateError(SwarmKVError):
    """llama.cpp could not create a context (too large for the model or for memory)."""


class ContextBudgetError(ConfigError):
    """The tokens a pipeline needs do not fit in n_ctx."""


class BatchError(ConfigError):
    """A batch is over capacity, has a position gap, or names a bad sequence."""


class NativeCallError(SwarmKVError):
    """A native call returned an error code or an unexpected byte count."""

    def __init__(self, fn: str, code: int, detail: str = "") -> None:
        self.fn = fn
        self.code = code
        message = f"{fn} returned {code}"
        super().__init__(f"{message}: {detail}" if detail else message)


class SnapshotMismatchError(SwarmKVError):
    """A KV snapshot does not fit the context it is restored into (model, size, bytes)."""


class SnapshotWriteError(SwarmKVError):
    """A snapshot file could not be written (a directory, disk full, a file-size limit)."""


class PoolError(SwarmKVError):
    """The host buffer pool's bookkeeping refused an operation (a buffer released twice, a
    state too large for host memory); allocation failures are InitError, use after close
    ClosedError."""


class DagError(ConfigError):
    """A pipeline graph is malformed: unknown or duplicate names, self-edges."""


class CycleError(DagError):
    """A pipeline graph has a cycle; `cycle` lists the node names around it."""

    def __init__(self, cycle: list[str]) -> None:
        self.cycle = cycle
        super().__init__("dependency cycle: " + " -> ".join(cycle))


class PipelineError(SwarmKVError):
    """A pipeline run finished with failed nodes (raised only when asked to)."""


class ClosedError(SwarmKVError):
    """Something closed was used: a model, context, batch, sampler, pool, swarm or Ray
    fan-out after close(), or a branch still running when its swarm closed."""


class TimeoutError(SwarmKVError, builtins.TimeoutError):
    """A wait ran past its timeout: a swarm branch's result, a drain, a document's prefill,
    Ray workers. Also a builtin TimeoutError, so `except TimeoutError` code keeps working.
    A pipeline run's timeout is not raised: each node unfinished by then ends `cancelled`
    with the timeout as its reason (PipelineResult.outcomes)."""


class InitError(SwarmKVError):
    """llama.cpp could not create a native object (a batch, a sampler chain, a buffer):
    llama_batch_init, llama_sampler_chain_init or an allocation returned NULL."""


class SwarmKVWarning(UserWarning):
    """A warning SwarmKV gives through `warnings.warn`: something that runs, but likely not as
    meant (more threads than CPUs, a prompt's {word} kept as literal text). Python's warnings
    filter shows each message once per place by default; filter on this class to silence or
    raise them."""


class QueueFullError(SwarmKVError):
    """The server's queue holds its maximum of waiting requests (HTTP 429)."""


class ContextLengthError(ContextBudgetError):
    """A prompt plus its max_tokens cannot fit the context (HTTP 400
    context_length_exceeded)."""


class CancelledError(SwarmKVError):
    """A request was cancelled (its client disconnected, or the server stopped)."""


class ReplicaError(SwarmKVError):
    """The engine replica that held a request failed (its process died, or Ray could not
    reach it): `swarmkv serve --ray-replicas` answers 503 `replica_failed` for that request
    alone, and the other replicas keep serving."""
