"""The CPU backend's own functions, reached through ggml's backend registry.

They live in the CPU backend library, which a portable build loads at run time (one variant
per instruction-set level), so the binding cannot link them: ggml_backend_reg_get_proc_address
hands them out by name. Used for the kernel switches' ranges (kernel_switches.py), for the
buffer types a repacked model's weights go to and, by the kernel tests and benchmarks, for a
bare CPU backend.
"""

from __future__ import annotations

from typing import Any

from .._native import ffi, lib
from ..errors import ConfigError
from .kernel_switches import KERNEL_SWITCHES, Switches


def cpu_proc(name: str, signature: str) -> Any:
    """The CPU backend's function `name` cast to `signature`; ConfigError when it has none
    (a build without SwarmKV's patches, or no CPU backend loaded)."""
    dev = lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU)
    reg = lib.ggml_backend_dev_backend_reg(dev) if dev != ffi.NULL else ffi.NULL
    fn = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg != ffi.NULL else ffi.NULL
    if fn == ffi.NULL:
        raise ConfigError(f"the CPU backend has no {name} (is SwarmKV's patch series applied?)")
    return ffi.cast(signature, fn)


def switch_id(name: str) -> int:
    """The enum ggml_cpu_switch value of a switch named in KERNEL_SWITCHES."""
    return int(getattr(lib, KERNEL_SWITCHES[name]))


# The extra buffer types whose kernels have a batch-invariant mode (patch 0011: CPU_REPACK's
# gemm in tiles of 4 rows). Model(repack=True) puts weights in every extra buffer type that
# takes them; any other (AMX on a build for AMX CPUs, KleidiAI on Arm) keeps kernels whose
# sums depend on the batch.
INVARIANT_WEIGHT_BUFFERS = frozenset({"CPU_REPACK"})


def extra_buffer_type_handles() -> dict[str, Any]:
    """The CPU backend's extra buffer types by name (ggml_backend_buffer_type_t), in the
    order weights try them."""
    get = cpu_proc(
        "ggml_backend_dev_get_extra_bufts", "ggml_backend_buffer_type_t * (*)(ggml_backend_dev_t)"
    )
    bufts = get(lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU))
    handles: dict[str, Any] = {}
    while bufts != ffi.NULL and bufts[len(handles)] != ffi.NULL:
        buft = bufts[len(handles)]
        handles[ffi.string(lib.ggml_backend_buft_name(buft)).decode()] = buft
    return handles


def extra_buffer_types() -> list[str]:
    """Names of the CPU backend's extra buffer types, in the order weights try them."""
    return list(extra_buffer_type_handles())


def repack_without_invariance() -> list[str]:
    """The extra buffer types a repacked model may use whose kernels have no batch-invariant
    mode: none means a batch-invariant context may take repacked weights."""
    return [name for name in extra_buffer_types() if name not in INVARIANT_WEIGHT_BUFFERS]


def switch_range(name: str) -> tuple[int, int, int]:
    """(lowest, highest, default) of a kernel switch, as the CPU backend defines them."""
    fn = cpu_proc(
        "ggml_cpu_switch_range", "bool (*)(enum ggml_cpu_switch, int32_t *, int32_t *, int32_t *)"
    )
    lo, hi, default = ffi.new("int32_t *"), ffi.new("int32_t *"), ffi.new("int32_t *")
    if not fn(switch_id(name), lo, hi, default):
        raise ConfigError(f"the CPU backend does not know the kernel switch {name!r}")
    return int(lo[0]), int(hi[0]), int(default[0])


def check_switch_values(switches: Switches) -> None:
    """ConfigError naming the first switch whose value is outside the backend's range."""
    for name, value in switches:
        lo, hi, default = switch_range(name)
        if not lo <= value <= hi:
            raise ConfigError(
                f"kernel switch {name} must be in [{lo}, {hi}] (default {default}), got {value}"
            )


def set_context_switches(ctx_ptr: Any, switches: Switches) -> None:
    """Set each switch on every CPU backend of a llama_context (values checked first);
    ConfigError when the context has no CPU backend that takes them."""
    check_switch_values(switches)
    for name, value in switches:
        if not lib.llama_swarmkv_set_cpu_switch(ctx_ptr, switch_id(name), value):
            raise ConfigError(
                f"kernel switch {name}={value}: this context has no CPU backend with SwarmKV's "
                "kernel switches"
            )


def context_switches(ctx_ptr: Any) -> dict[str, int]:
    """Every kernel switch's value on a llama_context's CPU backends (-1: no CPU backend)."""
    return {
        name: int(lib.llama_swarmkv_get_cpu_switch(ctx_ptr, switch_id(name)))
        for name in sorted(KERNEL_SWITCHES)
    }
