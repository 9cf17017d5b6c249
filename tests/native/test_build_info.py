"""What the build compiled in, read through ggml's own queries, and `swarmkv info`.

The AMX check is the guard for issue 7's crash (ggml's AMX kernels segfault on Q4_K_M weights
on Sapphire Rapids class CPUs): whatever CPU builds it, the default build has no AMX kernels.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import swarmkv
from swarmkv._native import BUILD
from swarmkv.llama.install_info import ggml_cpu_features, ggml_cpu_has, info, machine_cpu

from support.proc import run, stderr_tail, swarmkv_cmd

REPO = Path(__file__).resolve().parents[2]

# ggml feature name -> /proc/cpuinfo flag of the instruction set it needs at run time.
NEEDS_FLAG = {
    "AVX": "avx", "AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AVX_VNNI": "avx_vnni", "AMX_INT8": "amx_int8",
}  # fmt: skip


def test_default_build_has_no_amx_kernels() -> None:
    assert BUILD["amx_opt_in"] is False, "the tests run on the default build"
    assert "AMX_INT8" not in ggml_cpu_features()
    has = ggml_cpu_has()
    if has is not None:  # native build: ask ggml_cpu_has_amx_int8 directly too
        assert has["AMX_INT8"] is False
    assert info()["amx_kernels"] is False


def test_portable_build_ships_the_variants_asked_for_and_no_amx_variant() -> None:
    libs = BUILD["backend_libraries"]
    if BUILD["cpu_mode"] != "portable":
        assert "ggml-cpu" in libs and BUILD["cpu_variants_requested"] == []
        return
    built = {b.removeprefix("ggml-cpu-") for b in libs if b.startswith("ggml-cpu-")}
    assert "sapphirerapids" not in built  # the AMX variant, even when asked for
    asked = set(BUILD["cpu_variants_requested"])
    if asked:  # SWARMKV_CPU_VARIANTS: exactly those (CI asks for sapphirerapids too)
        assert built == asked - {"sapphirerapids"}, (built, asked)
    else:  # every x86 level
        assert len(built) >= 10 and {"haswell", "x64"} <= built, libs


def test_loaded_cpu_library_is_the_one_built() -> None:
    loaded = info()["ggml_cpu_library"]
    if Path("/proc/self/maps").exists():
        assert loaded is not None and "," not in loaded, "exactly one CPU backend is mapped"
        assert loaded.removeprefix("lib").removesuffix(".so") in BUILD["backend_libraries"]


def test_features_agree_with_ggml_cpu_has() -> None:
    features = ggml_cpu_features()
    has = ggml_cpu_has()
    if has is None:
        assert BUILD["cpu_mode"] == "portable"
        return
    for name, value in has.items():
        assert (name in features) == value, name


def test_compiled_instruction_sets_run_on_this_cpu() -> None:
    # A kernel compiled for an ISA the CPU lacks dies with SIGILL; say which, not crash.
    machine = machine_cpu()
    if machine["arch"] != "x86_64":
        return
    import platform

    assert platform.system() == "Linux"
    flags = set(Path("/proc/cpuinfo").read_text().split())
    missing = [f for f in ggml_cpu_features() if f in NEEDS_FLAG and NEEDS_FLAG[f] not in flags]
    assert missing == []


def test_commit_and_patches_match_the_source_tree() -> None:
    lock = tomllib.loads((REPO / "vendor" / "llama.cpp.lock").read_text())
    facts = info()
    assert facts["llama_cpp_commit"] == lock["commit"] == swarmkv.LLAMA_CPP_COMMIT
    expected = [
        f"{p.name}:{hashlib.sha256(p.read_bytes()).hexdigest()[:16]}"
        for p in sorted((REPO / "vendor" / "patches").glob("*.patch"))
    ]
    assert facts["patches"] == expected and expected


def test_info_fields_present_and_true() -> None:
    facts = info()
    assert facts["swarmkv_version"] == swarmkv.__version__
    assert facts["build"]["cpu_mode"] in ("native", "portable")
    assert ("CUDA" in facts["backends"]) is facts["build"]["cuda"]
    assert facts["build"]["cuda_reason"]
    assert "CPU" in facts["backends"]
    cpu_devices = [d for d in facts["devices"] if d["type"] == "CPU"]
    assert cpu_devices and cpu_devices[0]["memory_total_bytes"] > 0
    gpus = [d for d in facts["devices"] if d["type"] == "GPU"]
    assert facts["host_pool"]["pinned"] is bool(gpus)
    assert facts["host_pool"]["buffer_type"] == ("CPU" if not gpus else "CUDA_Host")
    with swarmkv.HostBufferPool() as pool:
        assert pool.kind == facts["host_pool"]["buffer_type"]
    assert set(facts["machine_cpu"]) == {"name", "arch", "logical_cores", "flags"}
    assert "path" in facts["default_model"] and "bytes" in facts["default_model"]


def test_cli_info_json_and_text(tmp_path: Path) -> None:
    proc = run(swarmkv_cmd("info", "--json"), cwd=tmp_path)
    assert proc.returncode == 0, stderr_tail(proc)
    facts = json.loads(proc.stdout)
    assert facts["llama_cpp_commit"] == swarmkv.LLAMA_CPP_COMMIT
    assert facts["ggml_cpu_features"] == ggml_cpu_features()
    proc = run(swarmkv_cmd("info"), cwd=tmp_path)
    assert proc.returncode == 0, stderr_tail(proc)
    text = proc.stdout
    assert "AMX kernels      not compiled in" in text
    assert f"build            CPU {BUILD['cpu_mode']}" in text
