"""What this install is and what it runs on: `swarmkv info` and `swarmkv.info()`.

Everything here is read from the loaded libraries and the machine, never assumed: the build
settings compiled into the extension, the CPU features ggml's loaded CPU backend reports
(`ggml_backend_get_features`, the same query llama.cpp's own tools print), the backends and
devices registered, and the host buffer type the snapshot pool would use.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from .._native import BUILD, LLAMA_CPP_COMMIT, ffi, lib

# /proc/cpuinfo flags worth showing next to what ggml compiled in (Linux spelling).
MACHINE_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512vbmi", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
)  # fmt: skip

# ggml_cpu_has_* (native builds link them) under the names ggml_backend_get_features uses.
CPU_HAS = {
    "SSE3": "ggml_cpu_has_sse3",
    "SSSE3": "ggml_cpu_has_ssse3",
    "AVX": "ggml_cpu_has_avx",
    "AVX_VNNI": "ggml_cpu_has_avx_vnni",
    "AVX2": "ggml_cpu_has_avx2",
    "BMI2": "ggml_cpu_has_bmi2",
    "F16C": "ggml_cpu_has_f16c",
    "FMA": "ggml_cpu_has_fma",
    "AVX512": "ggml_cpu_has_avx512",
    "AVX512_VBMI": "ggml_cpu_has_avx512_vbmi",
    "AVX512_VNNI": "ggml_cpu_has_avx512_vnni",
    "AVX512_BF16": "ggml_cpu_has_avx512_bf16",
    "AMX_INT8": "ggml_cpu_has_amx_int8",
    "LLAMAFILE": "ggml_cpu_has_llamafile",
}


def _text(ptr: Any) -> str:
    return "" if ptr == ffi.NULL else ffi.string(ptr).decode(errors="replace")


def _cpu_reg() -> Any:
    for i in range(lib.ggml_backend_reg_count()):
        reg = lib.ggml_backend_reg_get(i)
        if _text(lib.ggml_backend_reg_name(reg)) == "CPU":
            return reg
    raise RuntimeError("no CPU backend is registered with ggml")


def ggml_cpu_features() -> dict[str, str]:
    """Features the loaded ggml CPU backend was compiled with (`ggml_backend_get_features`)."""
    reg = _cpu_reg()
    proc = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
    if proc == ffi.NULL:
        raise RuntimeError("the CPU backend does not export ggml_backend_get_features")
    get = ffi.cast("ggml_backend_get_features_t", proc)
    features: dict[str, str] = {}
    entry = get(reg)
    i = 0
    while entry[i].name != ffi.NULL:
        features[_text(entry[i].name)] = _text(entry[i].value)
        i += 1
    return features


def loaded_cpu_library() -> str | None:
    """File name of the ggml CPU library mapped into this process (Linux), e.g. which
    libggml-cpu-<variant>.so a portable build picked; None where /proc is not there."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    names = {Path(line.split()[-1]).name for line in maps.read_text().splitlines() if "/" in line}
    found = sorted(n for n in names if n.startswith("libggml-cpu"))
    return ", ".join(found) or None


def ggml_cpu_has() -> dict[str, bool] | None:
    """The ggml_cpu_has_* answers, where the build links ggml-cpu (native); else None."""
    if BUILD["cpu_mode"] != "native":
        return None
    return {name: bool(getattr(lib, fn)()) for name, fn in CPU_HAS.items()}


def cpuinfo_fields() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo (model name, cpu family, flags, ...);
    empty where there is no /proc/cpuinfo."""
    fields: dict[str, str] = {}
    path = Path("/proc/cpuinfo")
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if not key and fields:
                break  # a blank line ends the first processor's block
            fields.setdefault(key, value.strip())
    return fields


def machine_cpu() -> dict[str, Any]:
    """This machine's CPU model name and the instruction-set flags of interest it has."""
    fields = cpuinfo_fields()
    flags = set(fields.get("flags", "").split())
    return {
        "name": fields.get("model name", platform.processor() or platform.machine()),
        "arch": platform.machine(),
        "logical_cores": os.cpu_count(),
        "flags": [f for f in MACHINE_FLAGS if f in flags],
    }


def devices() -> list[dict[str, Any]]:
    """Every ggml device registered: name, description, type, backend, memory."""
    kinds = {
        lib.GGML_BACKEND_DEVICE_TYPE_CPU: "CPU",
        lib.GGML_BACKEND_DEVICE_TYPE_GPU: "GPU",
        lib.GGML_BACKEND_DEVICE_TYPE_IGPU: "iGPU",
        lib.GGML_BACKEND_DEVICE_TYPE_ACCEL: "accelerator",
    }
    out = []
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        lib.ggml_backend_dev_memory(dev, free, total)
        out.append(
            {
                "name": _text(lib.ggml_backend_dev_name(dev)),
                "description": _text(lib.ggml_backend_dev_description(dev)),
                "type": kinds.get(lib.ggml_backend_dev_type(dev), "other"),
                "backend": _text(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev))),
                "memory_total_bytes": int(total[0]),
                "memory_free_bytes": int(free[0]),
            }
        )
    return out


def host_pool() -> dict[str, Any]:
    """The buffer type a HostBufferPool would allocate from here, and whether it is pinned."""
    from .pool import pick_buffer_type

    kind = _text(lib.ggml_backend_buft_name(pick_buffer_type(prefer_device=True)))
    return {"buffer_type": kind, "pinned": kind != "CPU"}


def default_model() -> dict[str, Any]:
    """Where the default model is and its size, or why it is not there."""
    from ..errors import ModelLoadError
    from .models import default_model_path

    try:
        path = default_model_path()
        return {"path": str(path), "bytes": path.stat().st_size}
    except (ModelLoadError, OSError) as exc:
        return {"path": None, "bytes": None, "error": str(exc)}


def info() -> dict[str, Any]:
    """Everything `swarmkv info` prints, as a JSON-ready dict."""
    from .._version import __version__

    features = ggml_cpu_features()
    return {
        "swarmkv_version": __version__,
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "patches": BUILD["patches"],
        "build": {k: BUILD[k] for k in ("cpu_mode", "cuda", "cuda_reason", "amx_opt_in")},
        "backend_libraries": BUILD["backend_libraries"],
        "ggml_cpu_library": loaded_cpu_library(),
        "ggml_cpu_features": features,
        "ggml_cpu_has": ggml_cpu_has(),
        "amx_kernels": "AMX_INT8" in features,
        "machine_cpu": machine_cpu(),
        "backends": [
            _text(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)))
            for i in range(lib.ggml_backend_reg_count())
        ],
        "devices": devices(),
        "host_pool": host_pool(),
        "default_model": default_model(),
    }
