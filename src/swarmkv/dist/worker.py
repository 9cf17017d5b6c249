"""BranchWorker: what one Ray actor does (plain Python; fanout.py wraps it with ray.remote).

It loads the model once, and for each job restores the driver's snapshot (a zero-copy view
of Ray's object store) into a pipeline of its own and runs its share of the branches with
the local scheduler (fork mode by default). It reports where its time went.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import SwarmKVError
from ..llama.config import FlashAttn
from ..llama.model import Model
from ..llama.models import default_model_path
from ..pipeline.concurrency import ConcurrencyPolicy
from ..pipeline.modes import ForkOptions
from ..pipeline.nodes import BranchNode
from ..pipeline.results import NodeOutcome, PipelineResult
from .payload import snapshot_from_payload


@dataclass(frozen=True)
class WorkerSettings:
    """The pipeline settings every worker uses (picklable: no locks, no callbacks)."""

    n_ctx: int | None = None
    n_batch: int = 512
    n_threads: int | None = None
    swa_full: bool | None = None
    flash_attn: FlashAttn = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    max_contexts: int | None = None  # ConcurrencyPolicy: None lets each mode choose
    fork: ForkOptions = field(default_factory=ForkOptions)
    exact: bool = True

    def pipeline_kwargs(self) -> dict[str, Any]:
        """Pipeline's keyword arguments (the policy rebuilt here from its one field)."""
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        kwargs["policy"] = ConcurrencyPolicy(kwargs.pop("max_contexts"))
        return kwargs


@dataclass(frozen=True)
class WorkerReport:
    """One worker's share of a job: its PipelineResult and where its time went (ms)."""

    worker: int
    host: str
    pid: int
    result: PipelineResult
    start_unix: float  # time.time() when the job started here: places it on the driver's clock
    get_ms: float  # ray.get of the snapshot payload (object store transfer, or a local map)
    verify_ms: float  # sha256 of the state against the driver's
    run_ms: float  # Pipeline.run: restore, prompts and generation


class BranchWorker:
    """One worker: a model loaded once, jobs run one at a time."""

    def __init__(self, index: int, model_path: str | None, exact: bool) -> None:
        """model_path None: the default model, found on this worker's node."""
        t0 = time.perf_counter_ns()
        self.index = index
        path = model_path if model_path is not None else default_model_path()
        # a batch-invariant pipeline keeps the GGUF layout (see Pipeline: repack=not exact)
        self.model = Model(path, repack=not exact)
        self.load_ms = (time.perf_counter_ns() - t0) / 1e6

    def info(self) -> dict[str, Any]:
        """Where this worker runs and what loading its model cost."""
        return {
            "worker": self.index,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "fingerprint": self.model.fingerprint,
            "load_ms": self.load_ms,
        }

    def run(
        self,
        payload_ref: Sequence[Any],
        doc_name: str,
        branches: Sequence[BranchNode],
        mode: str,
        s: WorkerSettings,
    ) -> WorkerReport:
        """Restore the snapshot in payload_ref[0] (an ObjectRef, inside a list so that Ray
        leaves the get to this method, which times it) and run the branches in mode."""
        import ray  # only ever imported in a worker process that Ray started

        from ..pipeline.builder import Pipeline

        start_unix = time.time()
        t0 = time.perf_counter_ns()
        payload = ray.get(payload_ref[0])
        t1 = time.perf_counter_ns()
        snap = snapshot_from_payload(payload)
        t2 = time.perf_counter_ns()
        try:
            with Pipeline(self.model, **s.pipeline_kwargs()) as pipe:
                pipe.prefill(doc_name, snapshot=snap)
                for b in branches:
                    pipe.branches[b.name] = b
                result = pipe.run(mode, raise_on_failure=False)
        finally:
            snap.release()
            del payload  # unpins the object in this worker
        t3 = time.perf_counter_ns()
        return WorkerReport(
            self.index,
            socket.gethostname(),
            os.getpid(),
            _portable(result),
            start_unix,
            (t1 - t0) / 1e6,
            (t2 - t1) / 1e6,
            (t3 - t2) / 1e6,
        )

    def close(self) -> None:
        """Free the model (the actor is then done)."""
        self.model.close()


class RemoteNodeError(SwarmKVError):
    """A node failed on a worker with an error that could not be sent back as itself."""


def _portable(result: PipelineResult) -> PipelineResult:
    """The result with every node error picklable, so it can travel back to the driver."""
    outcomes = {}
    for name, o in result.outcomes.items():
        err = o.error
        if err is not None:
            try:
                pickle.dumps(err)
            except Exception:
                err = RemoteNodeError(f"{type(o.error).__name__}: {o.error}")
        outcomes[name] = NodeOutcome(o.name, o.status, o.reason, err)
    return replace(result, outcomes=outcomes)
