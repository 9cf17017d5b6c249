"""Sample records for tests that render reports without running anything native."""

from __future__ import annotations

from typing import Any

# A provenance block shaped as swarmkv_bench.provenance.provenance() writes it.
PROVENANCE: dict[str, Any] = {
    "schema": "swarmkv-provenance/1",
    "date": "2026-12-02T03:00:00+00:00",
    "command": "swarmkv bench --swarm",
    "swarmkv_version": "0.1.0",
    "swarmkv_commit": "0123456789abcdef0123456789abcdef01234567",
    "llama_cpp_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
    "patches": ["0001-llama-keep.patch:0011223344556677"],
    "cpu": {
        "model_name": "AMD EPYC",
        "vendor": "AuthenticAMD",
        "family": "25",
        "model": "17",
        "stepping": "1",
        "arch": "x86_64",
        "logical_cores": 2,
        "usable_cores": 2,
        "flags": ["avx", "avx2", "avx512f", "fma"],
    },
    "ggml_cpu_features": ["AVX2", "AVX512"],
    "ggml_cpu_library": "libggml-cpu.so",
    "build": {"cpu_mode": "native", "cuda": False, "cuda_reason": "", "amx_opt_in": False},
    "switches": {},
    "model": {"name": "m.gguf", "path": "/m.gguf", "bytes": 1, "sha256": "ab" * 32},
    "python": "3.11.7",
}
