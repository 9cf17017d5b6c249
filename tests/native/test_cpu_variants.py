"""The kernel tests against every CPU variant of a portable build that this CPU can run.

A portable build (SWARMKV_CPU=portable) ships one CPU backend per instruction-set level (x64,
haswell: AVX2, icelake: AVX-512 VNNI, ...) and loads the best one the machine runs, so the
kernels of the other levels would never run on it: an AVX-512 machine would never test the
AVX2 kernels. Here each variant is loaded explicitly (SWARMKV_CPU_VARIANT, read by
swarmkv._native) in a fresh process and the kernel tests run against it; a variant this CPU
cannot execute is skipped, saying which. A native build has one CPU backend, which the kernel
tests test directly: nothing to add here (CI runs this file in its portable step).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from swarmkv._native import BUILD, VARIANT_ENV

from support.proc import run

REPO = Path(__file__).resolve().parents[2]
KERNEL_TESTS = (
    "tests/native/test_skinny_gemm.py",
    "tests/native/test_bi_attention.py",
    "tests/native/test_kquant_rows.py",
    "tests/native/test_repack_rows.py",
    "tests/native/test_batch_invariant_tiny.py",
)
VARIANTS = sorted(
    b.removeprefix("ggml-cpu-") for b in BUILD["backend_libraries"] if b.startswith("ggml-cpu-")
)
PROBE = (
    "import json, swarmkv._native as n; from swarmkv.llama.install_info import "
    "ggml_cpu_features, info; print(json.dumps([info()['ggml_cpu_library'], "
    "sorted(ggml_cpu_features())]))"
)


def _env(variant: str) -> dict[str, str]:
    return {VARIANT_ENV: variant}  # on top of this process's environment (support.proc)


@pytest.mark.skipif(
    BUILD["cpu_mode"] != "portable",
    reason="a native build has one CPU backend, which the kernel tests test directly",
)
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_kernel_tests_pass_on_the_variant(variant: str) -> None:
    probe = run([sys.executable, "-c", PROBE], cwd=REPO, env=_env(variant), timeout=120)
    if probe.returncode != 0:
        if "this CPU cannot run" in probe.stderr:
            pytest.skip(f"variant {variant}: this CPU cannot run it (its score is 0)")
        raise AssertionError(probe.stderr[-2000:])
    loaded, features = json.loads(probe.stdout.strip().splitlines()[-1])
    assert loaded == f"libggml-cpu-{variant}.so", (loaded, features)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS]
    proc = run(cmd, cwd=REPO, env=_env(variant), timeout=900)
    assert proc.returncode == 0, f"{variant} ({' '.join(features)}):\n{proc.stdout[-4000:]}"
