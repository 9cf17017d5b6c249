"""The benchmark's snapshot rows on the real model: device+inv (the prefix copied on device)
and host/fork+inv+shared (every run starts from one snapshot file mapped shared) run, restore,
and match the batch-invariant baseline token for token."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from support.proc import run, swarmkv_cmd

pytestmark = pytest.mark.slow  # the slow tier: a benchmark run

MODES = "baseline+inv,host+inv+shared,fork+inv+shared,device+inv"


def test_device_and_shared_rows_run_with_fidelity(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = ["--branches", "2", "--doc-tokens", "300", "-n", "6", "--trials", "1", "--warmup", "0"]
    args += ["--modes", MODES, "--no-memory-probe", "--out", str(out), "-t", "2"]
    proc = run(swarmkv_cmd("bench", *args), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    with (out / "all_trials.csv").open() as f:
        rows = {r["mode"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(MODES.split(","))
    for mode in ("host+inv+shared", "fork+inv+shared", "device+inv"):
        assert rows[mode]["fidelity_ok"] == "true", (mode, rows[mode]["fidelity_detail"])
        assert float(rows[mode]["restore_ms"].split(";")[0] or 0) >= 0
    # starting from the file, neither shared mode prefills the document
    assert float(rows["host+inv+shared"]["prefill_ms"]) < float(rows["device+inv"]["prefill_ms"])
    report = (out / "report.md").read_text()
    assert "start from a snapshot file made once before the trials" in report
