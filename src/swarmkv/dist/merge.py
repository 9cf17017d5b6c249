"""One PipelineResult from the workers' reports: the same fields as a local run, plus `dist`,
where the time went (driver prefill, object store put, and per worker get, verify, run)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..pipeline.nodes import BranchNode
from ..pipeline.results import BranchResult, NodeOutcome, PipelineResult
from .worker import WorkerReport


@dataclass(frozen=True)
class DriverTimes:
    """The driver's side of a job (milliseconds; start_unix is time.time() at its start)."""

    start_unix: float
    prefill_ms: float  # prefill and capture, or opening a snapshot that covers the document
    put_ms: float  # ray.put of the payload: the one copy into the object store
    e2e_ms: float  # job start to the last worker's report
    snapshot_bytes: int
    prefilled: bool  # False when a snapshot served the whole document


@dataclass(frozen=True)
class LostShare:
    """A worker that failed as a whole (died, or could not run its job)."""

    worker: int
    branches: Sequence[BranchNode]
    error: BaseException


def merge(
    mode: str,
    doc: tuple[str, int, str],
    order: Sequence[str],
    driver: DriverTimes,
    reports: Sequence[WorkerReport],
    lost: Sequence[LostShare],
    infos: Sequence[dict[str, Any]],
) -> PipelineResult:
    """doc is (name, token count, model file name); order: the branch names in the
    pipeline's order, which the result keeps. Branch times (first_token_ms, end_ms) are
    put on the driver's clock: milliseconds from the driver's job start."""
    doc_name, n_tokens, model_name = doc
    branches: dict[str, BranchResult] = {}
    outcomes = {doc_name: NodeOutcome(doc_name, "ok")}
    for rep in reports:
        shift = (rep.start_unix - driver.start_unix) * 1000.0
        for name, b in rep.result.branches.items():
            branches[name] = replace(
                b, first_token_ms=b.first_token_ms + shift, end_ms=b.end_ms + shift
            )
        outcomes.update({k: o for k, o in rep.result.outcomes.items() if k != doc_name})
    for share in lost:
        for node in share.branches:
            reason = f"worker {share.worker} failed: {share.error}"
            outcomes[node.name] = NodeOutcome(node.name, "failed", reason, share.error)
    branches = {n: branches[n] for n in order if n in branches}
    outcomes = {n: outcomes[n] for n in (doc_name, *order) if n in outcomes}
    kv = [r.result.kv_bytes for r in reports]
    return PipelineResult(
        mode=f"ray:{mode}",
        model=model_name,
        prefix_tokens=n_tokens,
        reused_tokens=0 if driver.prefilled else n_tokens,
        n_ctx=max((r.result.n_ctx for r in reports), default=0),
        prefill_ms=round(driver.prefill_ms, 3),
        snapshot_bytes=driver.snapshot_bytes,
        e2e_ms=round(driver.e2e_ms, 3),
        branches=branches,
        outcomes=outcomes,
        kv_bytes=sum(k for k in kv if k is not None) if kv and None not in kv else None,
        decode_stats=_summed(reports),
        dist=_dist(driver, reports, lost, infos),
    )


_ADDITIVE = ("prompt_ms", "gen_steps", "gen_ms", "gen_decode_ms", "logit_capture_ms")


def _summed(reports: Sequence[WorkerReport]) -> dict[str, float]:
    """Decode totals summed over the workers (which ran in parallel: CPU time, not wall)."""
    if not reports:
        return {}
    out = {k: sum(r.result.decode_stats.get(k, 0.0) for r in reports) for k in _ADDITIVE}
    steps, gen = out["gen_steps"], out["gen_ms"] or 1.0
    out["gen_ms_per_step"] = out["gen_ms"] / max(steps, 1.0)
    out["python_overhead_pct"] = 100.0 * (out["gen_ms"] - out["gen_decode_ms"]) / gen
    return out


def _restore_ms(res: PipelineResult) -> float:
    """Putting the snapshot into a worker's contexts: the document node (fork: the restore
    into the prefix sequence) plus each branch's own restore and copy (host: per branch)."""
    per_branch = sum((b.restore_ms or 0.0) + (b.fork_copy_ms or 0.0) for b in res.branches.values())
    return res.prefill_ms + per_branch


def _dist(
    driver: DriverTimes,
    reports: Sequence[WorkerReport],
    lost: Sequence[LostShare],
    infos: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    by_index = {i["worker"]: i for i in infos}
    workers = []
    for rep in reports:
        res = rep.result
        workers.append(
            {
                **by_index.get(rep.worker, {}),
                "worker": rep.worker,
                "host": rep.host,
                "pid": rep.pid,
                "branches": len(res.branches),
                "start_ms": round((rep.start_unix - driver.start_unix) * 1000.0, 3),
                "get_ms": round(rep.get_ms, 3),
                "verify_ms": round(rep.verify_ms, 3),
                "restore_ms": round(_restore_ms(res), 3),
                "run_ms": round(rep.run_ms, 3),
                "e2e_ms": res.e2e_ms,
                "n_ctx": res.n_ctx,
                "kv_bytes": res.kv_bytes,
                "decode_stats": res.decode_stats,
            }
        )
    return {
        "workers": workers,
        "lost_workers": [{"worker": s.worker, "error": repr(s.error)} for s in lost],
        "driver_prefill_ms": round(driver.prefill_ms, 3),
        "driver_prefilled": driver.prefilled,
        "put_ms": round(driver.put_ms, 3),
        "snapshot_bytes": driver.snapshot_bytes,
    }
