"""How far a generation step is from what the hardware allows, per config and mode.

Bytes: a step reads every weight at least once, so model_bytes over the memory bandwidth
measured on this machine (a memcpy: read + write traffic over its time, one thread) bounds
it from below; the KV cells a step reads come on top and are not counted, so the floor is
a lower bound. Arithmetic: 2 x params multiply-adds per row (token) in the step; the rate
achieved is stated, not a floor, because the CPU's peak rate is not measured here.
"""

from __future__ import annotations

import statistics
from typing import Any

from .modes import parse_mode
from .records import TrialRecord
from .sysinfo import memcpy_ms

BANDWIDTH_PROBE_BYTES = 256 * 2**20


def memcpy_gbps() -> float:
    """This machine's memcpy traffic (bytes read + written) in GB/s, best of 7."""
    return 2 * BANDWIDTH_PROBE_BYTES / (memcpy_ms(BANDWIDTH_PROBE_BYTES) * 1e6)


def rows_per_step(r: TrialRecord) -> int:
    """Token rows one generation step of a SwarmKV mode decodes: every branch in a batched
    fork, else one (the packing as parse_mode reads it from the mode name)."""
    spec = parse_mode(r.mode)
    batched = spec.mode == "fork" and spec.fork.packing == "batched"
    return r.n_branches if batched else 1


def floor_markdown(records: list[TrialRecord], setup: dict[str, Any]) -> str:
    """The floor table: measured ms/step, weights-read floor, x floor, GFLOP/s achieved."""
    model_bytes, params, gbps = (
        setup.get(k) for k in ("model_bytes", "model_params", "memcpy_gbps")
    )
    if not (model_bytes and params and gbps):
        return ""
    floor_ms = model_bytes / (gbps * 1e6)
    lines = [
        "## How far from the floor",
        "",
        f"A step reads every weight once: {model_bytes / 2**20:.0f} MiB at the measured "
        f"{gbps:.1f} GB/s memcpy rate is {floor_ms:.1f} ms (KV reads not counted, so the "
        "true floor is higher). Arithmetic: 2 x parameters per token row; the CPU's peak "
        "rate is not measured, so only the achieved rate is given.",
        "",
        "| config | mode | rows/step | ms/step | floor ms | x floor | GFLOP/s |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    groups: dict[tuple[str, str], list[TrialRecord]] = {}
    for r in records:
        if not r.is_warmup and "gen_ms_per_step" in r.extra:
            groups.setdefault((r.config_id, r.mode), []).append(r)
    for (cfg, mode), rs in sorted(groups.items()):
        step = statistics.median(r.extra["gen_ms_per_step"] for r in rs)
        rows = rows_per_step(rs[0])
        gflops = 2 * params * rows / (step * 1e6) if step > 0 else float("nan")
        lines.append(
            f"| {cfg} | {mode} | {rows} | {step:.1f} | {floor_ms:.1f} | "
            f"{step / floor_ms:.1f} | {gflops:.1f} |"
        )
    return "\n".join(lines) + "\n"
