"""all_trials.csv and best_run.json: the machine-readable outputs of one bench run.

Both use the metric names of shared/measuring.md (`e2e_ms`, `branch_activation_ms`, ...), and
both read back losslessly (`read_csv`; `json.load` for the JSON, which is strict: no NaN).
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .metrics import ModeSummary, Speedup
from .records import TrialRecord, jsonable

if TYPE_CHECKING:
    from .report import Target

log = logging.getLogger("swarmkv.bench")

SCHEMA = "swarmkv-bench/1"
SEP = ";"  # joins per-branch tuples inside one CSV cell
NONE = "None"  # a missing value inside a tuple (an empty cell would make (None,) read as ())
EXTRA_PREFIX = "extra."
# The record keeps the brief's short field name; outputs use the protocol's metric name.
_OUT_NAME = {"activation_ms": "branch_activation_ms"}
_IN_NAME = {v: k for k, v in _OUT_NAME.items()}
_RECORD_FIELDS = [f.name for f in fields(TrialRecord) if f.name != "extra"]


def write_csv(records: Sequence[TrialRecord], path: str | Path) -> Path:
    """One row per record; per-branch tuples ';'-joined, `extra` flattened to extra.<key>."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra_keys = sorted({k for r in records for k in r.extra})
    header = [_OUT_NAME.get(n, n) for n in _RECORD_FIELDS] + ["tokens_per_s"]
    header += [EXTRA_PREFIX + k for k in extra_keys]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for r in records:
            row = [_cell(getattr(r, n)) for n in _RECORD_FIELDS] + [_cell(r.tokens_per_s)]
            writer.writerow(row + [_cell(r.extra.get(k)) for k in extra_keys])
    log.info("wrote %d trial rows to %s", len(records), path)
    return path


def read_csv(path: str | Path) -> list[TrialRecord]:
    """Records back from `write_csv` (derived columns such as tokens_per_s are recomputed)."""
    types = {f.name: str(f.type) for f in fields(TrialRecord)}
    out: list[TrialRecord] = []
    with Path(path).open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            kw: dict[str, Any] = {}
            extra: dict[str, float] = {}
            for col, text in row.items():
                if col.startswith(EXTRA_PREFIX):
                    if text:
                        extra[col[len(EXTRA_PREFIX) :]] = float(text)
                    continue
                name = _IN_NAME.get(col, col)
                if name in types and name != "extra":
                    kw[name] = _parse(text, types[name])
            out.append(TrialRecord(**kw, extra=extra))
    return out


def build_best_run(
    summaries: dict[tuple[str, str], ModeSummary],
    speedups: Sequence[Speedup],
    records: Sequence[TrialRecord],
    setup: dict[str, Any],
    targets: Sequence[Target] = (),
) -> dict[str, Any]:
    """The best_run.json object: medians and spread lead; the best trial rides along."""
    mismatches = [_fid_entry(r) for r in records if r.fidelity_ok is False]
    ties = [_fid_entry(r) for r in records if r.extra.get("fidelity_near_ties", 0) > 0]
    checked = sum(r.fidelity_ok is not None for r in records)
    status = "MISMATCH" if mismatches else ("ok" if checked else "unchecked")
    if mismatches:
        log.error("FIDELITY MISMATCH in %d trial(s); see best_run.json", len(mismatches))
    configs: dict[str, Any] = {}
    for (config_id, mode), s in summaries.items():
        cfg = configs.setdefault(
            config_id,
            {
                "n_branches": s.n_branches,
                "doc_tokens": s.doc_tokens,
                "n_predict": s.n_predict,
                "modes": {},
                "speedups": [],
            },
        )
        cfg["modes"][mode] = s.to_dict() | {"best_trial_record": _best(records, s)}
    for sp in speedups:
        configs.setdefault(sp.config_id, {"modes": {}, "speedups": []})["speedups"].append(
            sp.to_dict()
        )
    return jsonable(
        {
            "schema": SCHEMA,
            "provenance": setup.get("provenance"),
            "setup": {k: v for k, v in setup.items() if k != "provenance"},
            "fidelity": {
                "status": status,
                "trials_checked": checked,
                "mismatches": len(mismatches),
                "near_ties": len(ties),
            },
            "fidelity_mismatches": mismatches,
            "fidelity_near_ties": ties,
            "configs": configs,
            "targets": [t.to_dict() for t in targets],
        }
    )


def write_best_run_json(
    summaries: dict[tuple[str, str], ModeSummary],
    speedups: Sequence[Speedup],
    records: Sequence[TrialRecord],
    setup: dict[str, Any],
    targets: Sequence[Target],
    path: str | Path,
) -> Path:
    """Write `build_best_run(...)` as strict JSON (non-JSON setup values become strings)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = build_best_run(summaries, speedups, records, setup, targets)
    path.write_text(
        json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n", encoding="utf-8"
    )
    log.info("wrote %s", path)
    return path


def _fid_entry(r: TrialRecord) -> dict[str, Any]:
    return {
        "config_id": r.config_id,
        "mode": r.mode,
        "trial": r.trial,
        "is_warmup": r.is_warmup,
        "detail": r.fidelity_detail,
    }


def _best(records: Iterable[TrialRecord], s: ModeSummary) -> dict[str, Any] | None:
    key = (s.config_id, s.mode, s.best_trial)
    for r in records:
        if (r.config_id, r.mode, r.trial) == key and not r.is_warmup:
            return {_OUT_NAME.get(k, k): v for k, v in r.to_dict().items()}
    return None


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back to the same float
    if isinstance(value, tuple):
        return SEP.join(NONE if v is None else _cell(v) for v in value)
    return str(value)


def _parse(text: str, type_name: str) -> Any:
    """Inverse of `_cell`, driven by the field's annotation (a string under __future__)."""
    if type_name.startswith("tuple["):
        inner = type_name[len("tuple[") :].split(",")[0]
        parts = text.split(SEP) if text else []
        return tuple(None if p == NONE else _parse(p, inner) for p in parts)
    if text == "" and "None" in type_name:
        return None
    base = type_name.split("|")[0].strip()
    if base == "bool":
        return text == "true"
    if base == "int":
        return int(text)
    if base == "float":
        return float(text) if text else math.nan
    return text
