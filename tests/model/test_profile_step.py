"""bench/profile_step.py on the default model: the three phases are timed and, with perf,
split by op with the weight kernels resolved by name (from the build folder's unstripped
libraries), so anyone can see where a step goes on their CPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "profile_step.py"


def run_profile(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "prof.json"
    cmd = [sys.executable, str(SCRIPT), "--doc-tokens", "600", "--branches", "4", "--steps", "2"]
    proc = subprocess.run(
        [*cmd, *flags, "-o", str(out)], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## 4-branch step" in proc.stdout
    return json.loads(out.read_text())


def test_phases_are_timed(tmp_path: Path) -> None:
    result = run_profile(tmp_path, "--no-perf")
    names = [p["phase"] for p in result["phases"]]
    assert names == ["prefill chunk (512 tokens)", "1-branch step", "4-branch step"]
    for phase in result["phases"]:
        assert 0 < phase["ms_min"] <= phase["ms_median"] <= phase["ms_max"]


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed")
def test_perf_splits_a_step_by_op(tmp_path: Path) -> None:
    result = run_profile(tmp_path)
    step = result["phases"][2]
    ops = {row["op"]: row for row in step["ops"]}
    assert abs(sum(r["share"] for r in step["ops"]) - 1.0) < 0.02
    matmul = sum(r["share"] for op, r in ops.items() if op.startswith("MUL_MAT"))
    assert matmul > 0.2, ops  # the weights dominate a decode step on any CPU
    assert "FLASH_ATTN_EXT" in ops
    # kernels are named, not bare addresses: the unstripped twins were found
    top = step["top_symbols"][0]["symbol"]
    assert not top.startswith("0x"), step["top_symbols"]
