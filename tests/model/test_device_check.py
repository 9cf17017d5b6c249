"""bench/device_check.sh end to end on this CPU, as far as a CPU goes: the bundle a GPU machine
without network gets (under the device tool's 64 MiB, with the vocabulary the generated model
needs and the patched tree's stamp), a small random-weight model of the Qwen2.5-7B kind, and
the run (the CUDA tests, skipped here and counted; the paper configuration, one trial) with
its report. The CUDA build itself and the 7B-shaped model run only on such a machine; the
installed SwarmKV stands in for the build here (--installed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "device_check.sh"

pytestmark = pytest.mark.slow


def _sh(*args: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEVICE_PYTHON": "3.11", "OUT": str(out)}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_bundle_build_and_run_on_a_cpu(tmp_path: Path) -> None:
    proc = _sh("bundle", out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    bundle = ROOT / ".device"
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size < 64 * 2**20 - 16 * 2**20, size  # room left for the project itself
    tree = bundle / "llama.cpp"
    stamp = (ROOT / "vendor" / "llama.cpp" / ".swarmkv-stamp").read_text()
    assert (tree / ".swarmkv-stamp").read_text() == stamp
    assert (tree / "models" / "ggml-vocab-qwen2.gguf").is_file()
    assert not (tree / "docs").exists() and not (tree / "ggml" / "src" / "ggml-vulkan").exists()
    assert {w.name.split("-")[0] for w in (bundle / "wheels").glob("*.whl")} == {
        "cffi",
        "pycparser",
        "gguf",
    }
    common = ("--cpu", "--shape", "small", "--installed")
    proc = _sh("build", *common, out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _sh("run", *common, "--trials", "1", out=tmp_path)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    report = (tmp_path / "device_report.md").read_text()
    assert "skipped" in report  # the CUDA tests, counted
    for mode in ("host", "fork", "device"):
        assert f"| {mode} |" in report, report
    assert (tmp_path / "paper-best_run.json").is_file() and (tmp_path / "info.txt").is_file()
    assert len(list(tmp_path.iterdir())) <= 8  # the device tool returns 8 files at most
