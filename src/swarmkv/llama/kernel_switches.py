"""The CPU backend's kernel switches, by name (pure: no native library).

SwarmKV's llama.cpp patches give the CPU backend switches for their kernels (enum
ggml_cpu_switch in the patched ggml-cpu.h). Each context sets its own through the backend's
API (ContextConfig.kernel_switches; llama_swarmkv_set_cpu_switch underneath): no kernel reads
the environment, so two contexts in one process can compare kernels side by side.

| name           | values (default first)                                                  |
|----------------|-------------------------------------------------------------------------|
| `skinny_gemm`  | 1 batch-invariant mode only; 0 off (tinyBLAS); 2 also plain mode, 16+ rows |
| `bi_attn`      | 1 patch 0005's attention; 0 patch 0003's one-row path                   |
| `bi_attn_tile` | 128 rows walked together sharing K/V conversions; 1..128                 |
| `kquant_rows`  | 1 patch 0008's K-quant rows; 0 vec_dot pair by pair                      |

Batch invariance itself is `ContextConfig.batch_invariant`, not a switch here. With the
defaults, plain mode (batch_invariant=False) computes upstream llama.cpp's numerics bit for
bit; `skinny_gemm=2` is the one value that changes them (tests/model/test_plain_upstream.py).
The ranges are the backend's own (ggml_cpu_switch_range), checked before a context uses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..checks import check_int
from ..errors import ConfigError

# name -> the enum constant's name in ggml-cpu.h (read from the binding where applied)
KERNEL_SWITCHES: dict[str, str] = {
    "skinny_gemm": "GGML_CPU_SWITCH_SKINNY_GEMM",
    "bi_attn": "GGML_CPU_SWITCH_BI_ATTN",
    "bi_attn_tile": "GGML_CPU_SWITCH_BI_ATTN_TILE",
    "kquant_rows": "GGML_CPU_SWITCH_KQUANT_ROWS",
}

Switches = tuple[tuple[str, int], ...]


def normalize_switches(switches: Mapping[str, int] | Iterable[tuple[str, int]]) -> Switches:
    """Switches as sorted (name, value) pairs: ConfigError for an unknown name, a repeated
    one or a value that is not an integer (ranges are the backend's, checked at context
    creation)."""
    pairs = list(switches.items() if isinstance(switches, Mapping) else switches)
    seen: dict[str, int] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ConfigError(f"kernel_switches: expected (name, value) pairs, got {pair!r}")
        name, value = pair
        if name not in KERNEL_SWITCHES:
            raise ConfigError(
                f"unknown kernel switch {name!r}; known: {', '.join(sorted(KERNEL_SWITCHES))}"
            )
        if name in seen:
            raise ConfigError(f"kernel switch {name!r} given twice")
        seen[name] = check_int(f"kernel switch {name}", value)
    return tuple(sorted(seen.items()))


def parse_switch_assignments(texts: Iterable[str]) -> Switches:
    """NAME=VALUE texts (a command line's) as normalized switches."""
    pairs: list[tuple[str, int]] = []
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ConfigError(f"a kernel switch is NAME=INTEGER, got {text!r}")
        pairs.append((name.strip(), int(value)))
    return normalize_switches(pairs)
