"""Pure arithmetic about KV caches and machine memory (no native import)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

# Bytes per element of each KV cache type (block-quantized types: block bytes / block size).
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


class ModelShape(Protocol):
    """What KV arithmetic needs of a model (Model satisfies it)."""

    @property
    def n_layer(self) -> int:
        """Number of layers."""
        ...

    @property
    def n_head_kv(self) -> int:
        """Number of key/value attention heads."""
        ...

    def head_dims(self) -> tuple[int, int]:
        """(key, value) head size."""
        ...


def estimate_kv_bytes(
    model: ModelShape, n_ctx: int, type_k: str = "f16", type_v: str = "f16"
) -> int:
    """Upper bound of a full-size KV cache for n_ctx cells (every layer, no SWA shrinking)."""
    k_dim, v_dim = model.head_dims()
    per_cell = model.n_head_kv * (k_dim * KV_TYPE_BYTES[type_k] + v_dim * KV_TYPE_BYTES[type_v])
    return int(model.n_layer * n_ctx * per_cell)


def mem_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, or None where that file does not exist."""
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None
