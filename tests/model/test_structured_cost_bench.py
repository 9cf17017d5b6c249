"""bench/structured_cost.py on the default model, small: both settings run, the constrained
one fast-forwards and completes objects, and the constraint's work is timed and reported
as a share of the free run's step, with the provenance the results pages need."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.proc import python_cmd, run

pytestmark = pytest.mark.slow  # the slow tier: a benchmark run

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "structured_cost.py"


def test_a_small_run_reports_both_settings_and_the_constraint_share(tmp_path: Path) -> None:
    out = tmp_path / "structured.json"
    flags = ["--doc-tokens", "300", "--branches", "4", "-n", "40", "--trials", "1"]
    proc = run([*python_cmd(str(SCRIPT), *flags), "-o", str(out)], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    free, constrained = result["free"]["trials"], result["constrained"]["trials"]
    assert len(free) == len(constrained) == 1
    assert 0 < free[0]["tokens"] <= 4 * 40
    c = constrained[0]
    assert 0 < c["forced_tokens"] < c["tokens"] <= 4 * 40  # the schema's keys are forced
    assert 0 <= c["complete"] <= 4
    assert 0 < c["mask_ms_p50"] <= c["mask_ms_p99"] <= c["mask_ms_max"]
    share = result["constraint_share"]["trials"][0]
    assert share == pytest.approx(c["constraint_ms_per_step"] / free[0]["ms_per_step"])
    assert 0 < share < 1
    assert result["provenance"]["command"].startswith("python ")
