"""bench/profile_step.py on the default model: the three phases are timed and, with perf,
split by op with the weight kernels resolved by name (from the build folder's unstripped
libraries), so anyone can see where a step goes on their CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support.proc import python_cmd, run

pytestmark = pytest.mark.slow  # the slow tier: a benchmark run

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "profile_step.py"


def run_profile(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "prof.json"
    cmd = python_cmd(str(SCRIPT), "--doc-tokens", "600", "--branches", "4", "--steps", "2")
    proc = run([*cmd, *flags, "-o", str(out)], cwd=tmp_path, timeout=600)
    if proc.returncode != 0 and "profile_step: perf" in proc.stderr:
        # perf is installed but cannot do its part here (perf_event_paranoid, a VM without
        # counters): nothing the user can fix in SwarmKV
        pytest.skip(proc.stderr.strip().splitlines()[-1][:300])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## 4-branch step" in proc.stdout
    return json.loads(out.read_text())


def test_phases_are_timed(tmp_path: Path) -> None:
    result = run_profile(tmp_path, "--no-perf")
    names = [p["phase"] for p in result["phases"]]
    assert names == ["prefill chunk (512 tokens)", "1-branch step", "4-branch step"]
    for phase in result["phases"]:
        assert 0 < phase["ms_min"] <= phase["ms_median"] <= phase["ms_max"]
    assert result["provenance"]["command"].startswith("python ")


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed")
def test_perf_splits_a_step_by_op(tmp_path: Path) -> None:
    result = run_profile(tmp_path)
    step = result["phases"][2]
    ops = {row["op"]: row for row in step["ops"]}
    assert abs(sum(r["share"] for r in step["ops"]) - 1.0) < 0.02
    matmul = sum(r["share"] for op, r in ops.items() if op.startswith("MUL_MAT"))
    assert matmul > 0.2, ops  # the weights dominate a decode step on any CPU
    assert "FLASH_ATTN_EXT" in ops
    # SwarmKV's own libraries' kernels are named, not bare addresses: their unstripped twins
    # in the build folder were found. System libraries (libgomp, libc) are stripped on most
    # machines and may stay unresolved; that is nothing SwarmKV or the user can change.
    ours = [s for s in step["top_symbols"] if s["dso"].startswith(("libggml", "libllama"))]
    assert ours, step["top_symbols"]
    assert not ours[0]["symbol"].startswith("0x"), ours
