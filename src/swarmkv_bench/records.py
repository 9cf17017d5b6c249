"""One row per (config, mode, trial): the raw material of every summary, plot and report.

Pure data: built from a `PipelineResult` (or anything shaped like one, so tests and the peer
llama-server runner can pass their own objects) without touching the native library.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from swarmkv.pipeline.fidelity import compare

log = logging.getLogger("swarmkv.bench")


class BranchLike(Protocol):
    """The parts of `swarmkv.pipeline.results.BranchResult` the harness reads."""

    @property
    def tokens(self) -> Sequence[int]:
        """Token ids the branch generated."""
        ...

    @property
    def activation_ms(self) -> float:
        """Milliseconds from when the branch may start to its first generated token."""
        ...

    @property
    def restore_ms(self) -> float | None:
        """Milliseconds restoring the prefix (host: llama_state_seq_set_data, fork: seq_cp).

        None for the baseline, which prefills instead.
        """
        ...

    @property
    def fork_copy_ms(self) -> float | None:
        """Milliseconds of host mode's copy-on-fork of the snapshot bytes; None elsewhere."""
        ...

    @property
    def prefill_ms(self) -> float | None:
        """Milliseconds of the baseline branch's own document prefill; None in other modes."""
        ...

    @property
    def decode_ms(self) -> float:
        """Milliseconds from the start of decoding to the last token (prompt + generation)."""
        ...

    @property
    def first_token_ms(self) -> float:
        """Milliseconds from pipeline start to the branch's first generated token."""
        ...

    @property
    def end_ms(self) -> float:
        """Milliseconds from pipeline start to the branch's last token."""
        ...


class ResultLike(Protocol):
    """The parts of `swarmkv.pipeline.results.PipelineResult` the harness reads."""

    @property
    def mode(self) -> str:
        """The handoff mode the pipeline ran in (host, fork or baseline)."""
        ...

    @property
    def prefix_tokens(self) -> int:
        """Tokens in the shared document prefix."""
        ...

    @property
    def prefill_ms(self) -> float:
        """Milliseconds of document prefill (the median when each branch prefilled)."""
        ...

    @property
    def snapshot_bytes(self) -> int:
        """Bytes of the host-mode KV snapshot of the document; 0 when none was taken."""
        ...

    @property
    def e2e_ms(self) -> float:
        """Milliseconds from pipeline start to the last branch's last token."""
        ...

    @property
    def branches(self) -> Mapping[str, BranchLike]:
        """Each branch's result, by branch name."""
        ...


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """One pipeline run. Per-branch tuples are indexed by branch position (`branch_names`);
    a branch that produced nothing holds NaN (or None) so later indices keep their meaning."""

    config_id: str
    n_branches: int
    doc_tokens: int
    n_predict: int
    mode: str
    trial: int
    e2e_ms: float
    is_warmup: bool = False
    prefill_ms: float | None = None  # None for peers whose prefill cannot be observed
    snapshot_bytes: int | None = None
    kv_bytes: int | None = None
    peak_rss_bytes: int | None = None
    activation_ms: tuple[float, ...] = ()
    first_token_ms: tuple[float, ...] = ()
    restore_ms: tuple[float | None, ...] = ()
    decode_ms: tuple[float, ...] = ()
    tokens_generated: int = 0
    fidelity_ok: bool | None = None  # None: not checked (the reference itself, or no tokens)
    fidelity_detail: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    branch_names: tuple[str, ...] = ()
    end_ms: tuple[float, ...] = ()
    branch_prefill_ms: tuple[float | None, ...] = ()  # baseline: each branch's own prefill
    fork_copy_ms: tuple[float | None, ...] = ()

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens over the whole pipeline's wall time."""
        if self.e2e_ms <= 0 or not math.isfinite(self.e2e_ms):
            return None
        return self.tokens_generated / (self.e2e_ms / 1000.0)

    @property
    def prefill_total_ms(self) -> float | None:
        """Prefill work summed over contexts: the baseline pays it once per branch."""
        own = [v for v in self.branch_prefill_ms if v is not None and math.isfinite(v)]
        if own:
            return float(sum(own))
        return self.prefill_ms

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples become lists, NaN becomes None (JSON has no NaN)."""
        return {k: jsonable(v) for k, v in asdict(self).items()} | {
            "tokens_per_s": jsonable(self.tokens_per_s)
        }


@dataclass(frozen=True)
class FidelityCheck:
    """Every branch of one run compared with the reference run's same branch."""

    ok: bool | None
    detail: str
    near_ties: int = 0
    first_nmse_max: float | None = None


def check_fidelity(
    tokens: Mapping[str, Sequence[int]],
    baseline: ResultLike | None,
    logits: Mapping[str, Sequence[np.ndarray]] | None = None,
    *,
    exact: bool = False,
    replay: Mapping[str, Sequence[int]] | None = None,
) -> FidelityCheck:
    """Compare token ids branch by branch with swarmkv.pipeline.fidelity.compare's judge.

    exact=True: any difference fails. Otherwise a divergence passes only as a near-tie proven
    by replay (each branch's tokens decoded alone with the baseline's shapes: a host run).
    Also serves peer (llama-server) runs: pass whatever tokens they returned.
    """
    if baseline is None:
        return FidelityCheck(None, "not checked: no baseline")
    if not tokens:
        return FidelityCheck(None, "not checked: no tokens")
    ok, notes, ties, nmses = True, [], 0, []
    for name in list(baseline.branches) + [n for n in tokens if n not in baseline.branches]:
        base = baseline.branches.get(name)
        if base is None or name not in tokens:
            ok = False
            notes.append(f"{name}: {'no baseline' if base is None else 'no output'}")
            continue
        base_logits = tuple(getattr(base, "step_logits", ()) or ())
        mine = tuple(logits.get(name, ())) if logits else ()
        again = replay.get(name) if replay is not None else None
        fid = compare(
            tokens[name],
            base.tokens,
            mine or None,
            base_logits or None,
            replay_tokens=again,
            exact=exact,
        )
        ok = ok and fid.ok
        ties += int(not fid.tokens_equal and fid.near_tie)
        if fid.first_nmse is not None and math.isfinite(fid.first_nmse):
            nmses.append(fid.first_nmse)
        notes.append(f"{name}: {fid.describe()}")
    return FidelityCheck(ok, "; ".join(notes), ties, max(nmses) if nmses else None)


def from_pipeline_result(
    result: ResultLike,
    *,
    config_id: str,
    trial: int,
    n_predict: int,
    is_warmup: bool = False,
    baseline: ResultLike | None = None,
    peak_rss_bytes: int | None = None,
    kv_bytes: int | None = None,
    n_branches: int | None = None,
    doc_tokens: int | None = None,
    branch_order: Sequence[str] | None = None,
    extra: Mapping[str, float] | None = None,
    exact: bool = False,
    replay: ResultLike | None = None,
) -> TrialRecord:
    """Build the record of one run; fidelity is checked against `baseline` when given.

    Branch order defaults to the baseline's (so index i means the same branch in every mode),
    else the result's own. Pass `baseline=None` for the reference run itself. exact=True:
    any difference fails; replay: a run decoding each branch alone with the baseline's
    shapes (host mode), the proof a divergence needs to count as a near-tie.
    """
    order = list(branch_order or (baseline.branches if baseline is not None else result.branches))
    fid = _fidelity_of(result, baseline, exact, replay)
    more = dict(extra or {})
    if fid.near_ties:
        more["fidelity_near_ties"] = float(fid.near_ties)
    if fid.first_nmse_max is not None:
        more["first_nmse_max"] = fid.first_nmse_max
    if fid.ok is False:
        log.error("FIDELITY MISMATCH %s/%s trial %d: %s", config_id, result.mode, trial, fid.detail)
    return TrialRecord(
        config_id=config_id,
        n_branches=n_branches if n_branches is not None else len(order),
        doc_tokens=doc_tokens if doc_tokens is not None else result.prefix_tokens,
        n_predict=n_predict,
        mode=result.mode,
        trial=trial,
        is_warmup=is_warmup,
        e2e_ms=float(result.e2e_ms),
        prefill_ms=_opt_float(result.prefill_ms),
        snapshot_bytes=result.snapshot_bytes,
        kv_bytes=kv_bytes if kv_bytes is not None else getattr(result, "kv_bytes", None),
        peak_rss_bytes=peak_rss_bytes,
        fidelity_ok=fid.ok,
        fidelity_detail=fid.detail,
        extra=more,
        branch_names=tuple(order),
        **_branch_fields([result.branches.get(n) for n in order]),
    )


def _branch_fields(got: Sequence[BranchLike | None]) -> dict[str, Any]:
    """The per-branch tuples of a record, by branch position (NaN / None where one is missing)."""
    return {
        "activation_ms": tuple(_num(b, "activation_ms") for b in got),
        "first_token_ms": tuple(_num(b, "first_token_ms") for b in got),
        "restore_ms": tuple(_opt(b, "restore_ms") for b in got),
        "decode_ms": tuple(_num(b, "decode_ms") for b in got),
        "end_ms": tuple(_num(b, "end_ms") for b in got),
        "branch_prefill_ms": tuple(_opt(b, "prefill_ms") for b in got),
        "fork_copy_ms": tuple(_opt(b, "fork_copy_ms") for b in got),
        "tokens_generated": sum(len(b.tokens) for b in got if b is not None),
    }


def _fidelity_of(
    result: ResultLike, baseline: ResultLike | None, exact: bool, replay: ResultLike | None
) -> FidelityCheck:
    if baseline is None or baseline is result:
        return FidelityCheck(None, "reference run" if baseline is result else "not checked")
    if not result.branches and baseline.branches:
        return FidelityCheck(False, "no branch produced output")
    tokens = {n: b.tokens for n, b in result.branches.items()}
    logits = {n: tuple(getattr(b, "step_logits", ()) or ()) for n, b in result.branches.items()}
    again = {n: b.tokens for n, b in replay.branches.items()} if replay is not None else None
    return check_fidelity(tokens, baseline, logits, exact=exact, replay=again)


def _num(branch: BranchLike | None, attr: str) -> float:
    value = getattr(branch, attr, None) if branch is not None else None
    return float(value) if value is not None else math.nan


def _opt(branch: BranchLike | None, attr: str) -> float | None:
    return _opt_float(getattr(branch, attr, None)) if branch is not None else None


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def jsonable(value: Any) -> Any:
    """Strict-JSON form: tuples to lists, NaN and infinities to None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value
