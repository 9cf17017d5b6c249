"""all_trials.csv and best_run.json: round trips, metric names, loud fidelity mismatches."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from swarmkv_bench.metrics import speedups, summarize
from swarmkv_bench.records import TrialRecord
from swarmkv_bench.report import Target
from swarmkv_bench.synthetic import synthetic_records
from swarmkv_bench.writers import build_best_run, read_csv, write_best_run_json, write_csv

from support.samples import PROVENANCE

CFG = "N2-doc3501-p32"


def _strict(text: str) -> Any:
    def no_constants(name: str) -> None:
        raise AssertionError(f"non-JSON constant {name} in output")

    return json.loads(text, parse_constant=no_constants)


def _write_json(tmp_path: Path, records: list[TrialRecord], **kw: Any) -> dict[str, Any]:
    sums = summarize(records)
    targets = kw.pop("targets", [Target("speedup_e2e", 1.9, 1.5, ">=", "x")])
    setup = kw.pop("setup", {"model": "gemma-3-270m", "threads": 8, "path": tmp_path})
    path = write_best_run_json(sums, speedups(sums), records, setup, targets, tmp_path / "b.json")
    return _strict(path.read_text(encoding="utf-8"))


def test_csv_round_trips_every_record(tmp_path: Path) -> None:
    records = synthetic_records(configs=[(2, 3501, 32), (4, 512, 16)])
    records[3] = TrialRecord(**(records[3].__dict__ | {"extra": {"first_nmse_max": 1.5e-7}}))
    path = write_csv(records, tmp_path / "out" / "all_trials.csv")
    assert path.exists()
    assert read_csv(path) == records


def test_csv_is_plain_csv_with_metric_names(tmp_path: Path) -> None:
    records = synthetic_records()
    path = write_csv(records, tmp_path / "all_trials.csv")
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(records)
    first = rows[0]
    for col in (
        "config_id",
        "mode",
        "trial",
        "is_warmup",
        "e2e_ms",
        "prefill_ms",
        "branch_activation_ms",
        "restore_ms",
        "decode_ms",
        "tokens_per_s",
        "snapshot_bytes",
        "peak_rss_bytes",
        "fidelity_ok",
        "fidelity_detail",
    ):
        assert col in first
    assert first["is_warmup"] == "true"
    assert len(first["branch_activation_ms"].split(";")) == 2
    assert float(first["e2e_ms"]) == records[0].e2e_ms


def test_csv_keeps_missing_values_missing(tmp_path: Path) -> None:
    r = TrialRecord(
        config_id="c",
        n_branches=2,
        doc_tokens=1,
        n_predict=1,
        mode="m",
        trial=0,
        e2e_ms=5.0,
        activation_ms=(math.nan, 2.0),
        restore_ms=(None,),
    )
    (back,) = read_csv(write_csv([r], tmp_path / "t.csv"))
    assert math.isnan(back.activation_ms[0]) and back.activation_ms[1] == 2.0
    assert back.restore_ms == (None,) and back.prefill_ms is None and back.fidelity_ok is None


def test_best_run_json_holds_medians_spread_best_trial_and_speedups(tmp_path: Path) -> None:
    records = synthetic_records()
    doc = _write_json(tmp_path, records)
    assert doc["setup"]["model"] == "gemma-3-270m"
    assert doc["setup"]["path"] == str(tmp_path)  # non-JSON values become text
    cfg = doc["configs"][CFG]
    assert set(cfg["modes"]) == {"baseline", "fork", "host", "server-np1"}
    fork = cfg["modes"]["fork"]
    expect = summarize(records)[CFG, "fork"]
    assert expect.e2e_ms is not None
    assert fork["e2e_ms"]["median"] == expect.e2e_ms.median
    assert fork["e2e_ms"]["iqr"] == pytest.approx(expect.e2e_ms.iqr)
    assert fork["best_trial_record"]["trial"] == expect.best_trial
    assert fork["best_trial_record"]["is_warmup"] is False
    assert "branch_activation_ms" in fork["best_trial_record"]
    sp = {s["mode"]: s for s in cfg["speedups"]}
    assert set(sp) == {"fork", "host", "server-np1"}
    assert sp["fork"]["speedup_e2e"] > 1 and len(sp["fork"]["speedup_activation"]) == 2
    assert sp["server-np1"]["redundant_prefill_eliminated_ms"] is None
    assert doc["targets"][0] == {
        "name": "speedup_e2e",
        "value": 1.9,
        "threshold": 1.5,
        "op": ">=",
        "unit": "x",
        "note": "",
        "passed": True,
        "status": "PASS",
    }


def test_clean_run_reports_fidelity_ok(tmp_path: Path) -> None:
    doc = _write_json(tmp_path, synthetic_records())
    assert doc["fidelity"]["status"] == "ok"
    assert doc["fidelity"]["mismatches"] == 0 and doc["fidelity_mismatches"] == []
    assert doc["fidelity"]["trials_checked"] == 8  # fork + host over 4 trials incl. warm-up


def test_fidelity_mismatch_is_loud_in_json(tmp_path: Path) -> None:
    records = synthetic_records(mismatch=(CFG, "host", 2))
    doc = _write_json(tmp_path, records)
    assert doc["fidelity"]["status"] == "MISMATCH" and doc["fidelity"]["mismatches"] == 1
    (bad,) = doc["fidelity_mismatches"]
    assert (bad["config_id"], bad["mode"], bad["trial"]) == (CFG, "host", 2)
    assert "NOT a near-tie" in bad["detail"]
    assert doc["configs"][CFG]["modes"]["host"]["fidelity_failed"] == 1


def test_nan_never_reaches_json(tmp_path: Path) -> None:
    r = TrialRecord(
        config_id="c",
        n_branches=2,
        doc_tokens=1,
        n_predict=1,
        mode="m",
        trial=0,
        e2e_ms=5.0,
        activation_ms=(math.nan, 2.0),
    )
    doc = _write_json(
        tmp_path, [r], targets=[Target("t", math.nan, 1.0, "<=")], setup={"x": math.inf}
    )
    assert doc["setup"]["x"] is None
    assert doc["configs"]["c"]["modes"]["m"]["best_trial_record"]["branch_activation_ms"] == [
        None,
        2.0,
    ]
    assert doc["targets"][0]["status"] == "NOT MEASURED"


def test_build_best_run_without_anything() -> None:
    doc = build_best_run({}, [], [], {})
    assert doc["fidelity"]["status"] == "unchecked" and doc["configs"] == {}


def test_the_provenance_block_leads_best_run_json_apart_from_the_setup() -> None:
    doc = build_best_run({}, [], [], {"threads": 2, "provenance": PROVENANCE})
    assert doc["provenance"] == PROVENANCE
    assert doc["setup"] == {"threads": 2}
    assert list(doc)[:3] == ["schema", "provenance", "setup"]
