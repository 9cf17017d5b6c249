"""RayFanout: one pipeline's branches spread over workers on a Ray cluster.

    with Pipeline() as p, RayFanout(p.model.path, workers=2) as fan:
        p.prefill("doc", text=document)
        for i in range(32):
            p.branch(f"q{i}", prompt=f"\\nQuestion {i}:", n_predict=32)
        result = fan.run(p)          # a PipelineResult, as p.run() gives, plus result.dist

The driver prefills the document once (or takes a snapshot that already holds it), puts the
snapshot into Ray's object store once (payload.py: a zero-copy view, no per-branch copies),
and each worker (worker.py, a Ray actor that loaded the model once) restores it into its own
context and runs its share of the branches with the local scheduler. With exact=True (the
default: batch-invariant kernels) every token equals what a local run gives, however the
branches are split. Ray is imported here only: `import swarmkv` never imports it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checks import check_seconds
from ..errors import (
    ClosedError,
    ConfigError,
    ModelLoadError,
    PipelineError,
    SwarmKVError,
    TimeoutError,
)
from ..pipeline.nodes import BranchNode
from ..pipeline.spec import check_sequences
from ..process.interrupt import INTERRUPT
from ..process.interrupt import check as check_interrupt
from .merge import DriverTimes, LostShare, merge
from .payload import snapshot_payload
from .plan import assign
from .worker import BranchWorker, WorkerReport, WorkerSettings

if TYPE_CHECKING:
    from ..kv.snapshot import KVSnapshot
    from ..pipeline.builder import Pipeline
    from ..pipeline.results import PipelineResult

log = logging.getLogger("swarmkv.dist")

RAY_MODES = ("fork", "host", "device")  # baseline prefills per branch: nothing to fan out
WAIT_SLICE_S = 0.2
INSTALL_HINT = "pip install 'swarmkv[dist]' (from a checkout: pip install '.[dist]')"


def import_ray() -> Any:
    """The ray module, or ConfigError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"Ray fan-out needs the ray package ({exc}): {INSTALL_HINT}") from None
    return ray


class RayFanout:
    """Workers on a Ray cluster, each holding the model (loaded once, at construction).

    start_timeout_s bounds the wait for workers to start (ConfigError after it: a cluster
    with too few free CPUs would otherwise queue them forever).
    model_path=None (or the default model's path) lets each worker find the default model
    itself (installed from PyPI on its node, as here); another model must be at the same path
    on every node.
    address=None starts a local Ray instance (stopped by close()) unless this process is
    already connected to one; otherwise it is passed to ray.init ("auto", "ray://host:port").
    threads: CPU threads per worker (default: this machine's CPUs shared out on a local
    instance, every CPU of its node on a cluster); each worker reserves that many Ray CPUs.
    Workers are placed with Ray's SPREAD strategy: on different nodes when there are several.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        workers: int = 2,
        address: str | None = None,
        threads: int | None = None,
        exact: bool = True,
        start_timeout_s: float = 300.0,
    ) -> None:
        check_seconds("start_timeout_s", start_timeout_s)
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        path = _model_for_workers(model_path)
        ray = import_ray()
        self.exact = exact
        local = address is None
        if local and threads is None:
            threads = max(1, (os.cpu_count() or 1) // workers)
        self.threads = threads
        self._started_ray = False
        if not ray.is_initialized():
            cpus = workers * (threads or 1) if local else None
            try:
                ray.init(
                    address=address, num_cpus=cpus, include_dashboard=False, logging_level="WARNING"
                )
            except (ConnectionError, ValueError, RuntimeError) as exc:
                where = "a local Ray instance" if local else f"the Ray cluster at {address!r}"
                raise ConfigError(f"could not start or reach {where}: {exc}") from None
            self._started_ray = True
        remote_cls = ray.remote(BranchWorker)
        self._actors = [
            remote_cls.options(num_cpus=threads or 1, scheduling_strategy="SPREAD").remote(
                i, path, exact
            )
            for i in range(workers)
        ]
        try:
            self.infos: list[dict[str, Any]] = ray.get(
                [a.info.remote() for a in self._actors], timeout=start_timeout_s
            )
        except ray.exceptions.GetTimeoutError:
            free = ray.available_resources().get("CPU", 0)
            self.close(graceful=False)  # workers that never started have nothing to free
            raise ConfigError(
                f"{workers} Ray workers did not start within {start_timeout_s} s: each reserves "
                f"{threads or 1} CPU(s) and the cluster has {free:g} free"
            ) from None
        except Exception as exc:
            self.close()
            raise _cause(exc) from None
        log.info("ray: %d workers ready: %s", workers, self.infos)

    @property
    def workers(self) -> int:
        """How many workers this fan-out has."""
        return len(self._actors)

    def run(
        self,
        pipeline: Pipeline,
        mode: str = "fork",
        *,
        timeout_s: float | None = None,
        raise_on_failure: bool = True,
        progress: Callable[[int, int], None] | None = None,
    ) -> PipelineResult:
        """Run pipeline's branches on the workers; its document is prefilled here, once.

        Every check (mode, graph, callbacks, watermarks, model, exactness) runs before the
        prefill. Node failures are in the result (raised as PipelineError when
        raise_on_failure); a worker that dies fails its branches with the reason. ClosedError
        after close() (a timeout or Ctrl-C closes the fan-out too).
        """
        check_seconds("timeout_s", timeout_s, zero_ok=True)  # NaN would never time out
        if not self._actors:
            raise ClosedError("this RayFanout is closed")
        ray = import_ray()
        shares, doc_tokens = self._check(pipeline, mode)
        assert pipeline.doc is not None
        t_start, start_unix = time.perf_counter_ns(), time.time()
        snap, owned, prefilled = _document_snapshot(pipeline, doc_tokens, progress)
        t_put = time.perf_counter_ns()
        try:
            ref = ray.put(snapshot_payload(snap))
        finally:
            nbytes = snap.nbytes
            if owned:
                snap.release()
        t_sent = time.perf_counter_ns()
        settings = _settings(pipeline, self.threads)
        doc = pipeline.doc.name
        jobs = [
            (w, share, self._actors[w].run.remote([ref], doc, share, mode, settings))
            for w, share in enumerate(shares)
            if share
        ]
        reports, lost = self._gather(jobs, timeout_s)
        del ref  # the object store frees the snapshot once the workers let go of it too
        driver = DriverTimes(
            start_unix,
            (t_put - t_start) / 1e6,
            (t_sent - t_put) / 1e6,
            (time.perf_counter_ns() - t_start) / 1e6,
            nbytes,
            prefilled,
        )
        doc_info = (doc, len(snap.tokens), pipeline.model.path.name)
        result = merge(mode, doc_info, list(pipeline.branches), driver, reports, lost, self.infos)
        failed = [o for o in result.outcomes.values() if o.status == "failed"]
        if raise_on_failure and failed:
            detail = "; ".join(f"{o.name}: {o.reason or o.error!r}" for o in failed)
            raise PipelineError(f"{len(failed)} branch(es) failed on Ray workers: {detail}")
        return result

    def _check(self, pipeline: Pipeline, mode: str) -> tuple[list[list[BranchNode]], list[int]]:
        """Everything that can be refused before the prefill; returns each worker's share of
        the branches, and the document's tokens (tokenized once, here)."""
        if mode not in RAY_MODES:
            raise ConfigError(f"Ray fan-out runs modes {', '.join(RAY_MODES)}, not {mode!r}")
        if pipeline.base.batch_invariant != self.exact:
            raise ConfigError(
                f"the pipeline has exact={pipeline.base.batch_invariant} but the workers were "
                f"started with exact={self.exact}"
            )
        fingerprints = {i.get("fingerprint") for i in self.infos}
        if fingerprints != {pipeline.model.fingerprint}:
            raise ConfigError(
                f"the workers loaded another model than the pipeline's {pipeline.model.path.name}"
            )
        branches = pipeline.spec(mode).validate()
        assert pipeline.doc is not None  # validate() refuses a pipeline without one
        doc_tokens = pipeline.doc.tokenize(pipeline.model)
        n_doc = len(doc_tokens)
        for b in branches:
            if b.on_token is not None:
                raise ConfigError(
                    f"branch {b.name!r}: an on_token callback cannot run in a Ray worker"
                )
            w = b.required_prefix_tokens
            if w is not None and w < n_doc:
                raise ConfigError(
                    f"branch {b.name!r}: required_prefix_tokens={w} is below the document's "
                    f"{n_doc} tokens; Ray workers start from the whole document's snapshot"
                )
        shares = assign(branches, self.workers)
        for share in shares:
            check_sequences(mode, len(share), pipeline.base.n_batch)
        return shares, doc_tokens

    def _gather(
        self, jobs: Sequence[tuple[int, Sequence[BranchNode], Any]], timeout_s: float | None
    ) -> tuple[list[WorkerReport], list[LostShare]]:
        ray = import_ray()
        refs = [j[2] for j in jobs]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = refs
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            # short waits, so that Ctrl-C (swarmkv.process.interrupt's flag) is seen within 0.2 s
            wait_s = WAIT_SLICE_S if left is None else min(WAIT_SLICE_S, left)
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=wait_s)
            if INTERRUPT.is_set() or (pending and left is not None and left <= wait_s):
                # a busy actor cannot be interrupted: the fan-out ends here
                self.close(graceful=False)
                check_interrupt()
                raise TimeoutError(f"Ray workers did not finish within {timeout_s} s (closed)")
        reports, lost = [], []
        for w, share, ref in jobs:
            try:
                reports.append(ray.get(ref))
            except Exception as exc:
                lost.append(LostShare(w, share, _cause(exc)))
        return reports, lost

    def close(self, *, graceful: bool = True) -> None:
        """Free each worker's model, end the actors, and stop Ray if this started it.
        Idempotent. graceful=False only kills the actors (their processes free everything)."""
        actors, self._actors = self._actors, []
        if actors:
            ray = import_ray()
            for a in actors:
                if graceful:
                    try:
                        ray.get(a.close.remote(), timeout=30)
                    except Exception as exc:  # a dead or stuck worker: killing it frees it
                        log.warning("ray worker close: %s", exc)
                ray.kill(a)
        if self._started_ray:
            self._started_ray = False
            import_ray().shutdown()

    def __enter__(self) -> RayFanout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_on_ray(
    pipeline: Pipeline,
    mode: str = "fork",
    *,
    workers: int = 2,
    address: str | None = None,
    threads: int | None = None,
    **run_kwargs: Any,
) -> PipelineResult:
    """One pipeline run on a fan-out made for it (workers load the model, then end)."""
    with RayFanout(
        pipeline.model.path,
        workers=workers,
        address=address,
        threads=threads,
        exact=pipeline.base.batch_invariant,
    ) as fan:
        return fan.run(pipeline, mode, **run_kwargs)


def _model_for_workers(model_path: str | os.PathLike[str] | None) -> str | None:
    """What each worker loads: None for the default model (found on its own node), else
    an absolute path (checked here for a local file)."""
    from ..llama.models import default_model_path

    if model_path is None:
        return None
    path = Path(model_path).resolve()
    if not path.is_file():
        raise ConfigError(f"model file not found: {path}")
    try:
        default = default_model_path().resolve()
    except ModelLoadError:  # no usable default (SWARMKV_MODEL wrong): the path it is
        return str(path)
    return None if path == default else str(path)


def _document_snapshot(
    pipeline: Pipeline, doc_tokens: list[int], progress: Callable[[int, int], None] | None
) -> tuple[KVSnapshot, bool, bool]:
    """(snapshot of the whole document, whether the caller releases it, whether it was
    prefilled here). A snapshot source that holds exactly the document is used as it is."""
    from ..kv.snapshot import KVSnapshot

    doc = pipeline.doc
    assert doc is not None
    source = doc.snapshot
    if source is not None and list(source.tokens) == doc_tokens:
        if source.snapshot is not None:
            return source.snapshot, False, False
        assert source.path is not None
        return KVSnapshot.open_shared(source.path), True, False
    return pipeline.snapshot(progress=progress), True, True


def _settings(pipeline: Pipeline, threads: int | None) -> WorkerSettings:
    base = pipeline.base
    return WorkerSettings(
        n_ctx=pipeline.n_ctx,
        n_batch=base.n_batch,
        n_threads=threads,
        swa_full=base.swa_full,
        flash_attn=base.flash_attn,
        type_k=base.type_k,
        type_v=base.type_v,
        max_contexts=pipeline.policy.max_contexts,
        fork=pipeline.fork,
        exact=base.batch_invariant,
    )


def _cause(exc: BaseException) -> BaseException:
    """The error a Ray task raised, unwrapped from RayTaskError when it carries one."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return cause
    return exc if isinstance(exc, SwarmKVError) else SwarmKVError(f"Ray: {exc}")
