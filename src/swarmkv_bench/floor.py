"""How far a generation step is from what the hardware allows, per config and mode.

The floor is the hardware's (hw_floor.py): a step's multiply-adds at this CPU's peak int8
rate, its attention FMAs at the peak f32 rate, and its bytes (every weight, the shared KV
once) at the peak read bandwidth, all three measured in the same run (hw_peak.py), the
largest of them. It is a lower bound, never a measured time. The kernels' own best int8 rate
(kernel_rate.py) is reported beside it, as what these kernels reach, not what the CPU could.
"""

from __future__ import annotations

import statistics
from typing import Any

from .hw_floor import ModelShape, decode_floor
from .hw_peak import HardwarePeaks
from .modes import parse_mode
from .records import TrialRecord


def rows_per_step(r: TrialRecord) -> int:
    """Token rows one generation step of a SwarmKV mode decodes: every branch in a batched
    fork, else one (the packing as parse_mode reads it from the mode name)."""
    spec = parse_mode(r.mode)
    batched = spec.mode == "fork" and spec.fork.packing == "batched"
    return r.n_branches if batched else 1


def step_floor(r: TrialRecord, shape: ModelShape, peaks: HardwarePeaks) -> Any:
    """The floor of one generation step of r's mode: its rows each see the document (the
    cells they add are left out: a lower bound), the batched rows share its cells."""
    rows = rows_per_step(r)
    return decode_floor(shape, peaks, [r.doc_tokens] * rows, rows, r.doc_tokens + rows)


def _peaks_line(peaks: HardwarePeaks, kernel_rate: float | None) -> str:
    def rate(value: float | None, unit: str) -> str:
        return f"{value:.1f} {unit}" if value else "not measured"

    kernels = f"{kernel_rate:.1f} G/s" if kernel_rate else "not measured"
    return (
        f"This CPU's peaks, measured in this run with {peaks.threads} threads "
        f"(swarmkv_bench/hw_peak.py): int8 multiply-adds {rate(peaks.int8_gmacs, 'G/s')} "
        f"({peaks.int8_isa or 'no loop'}), f32 FMAs {rate(peaks.fma_gfmas, 'G/s')} "
        f"({peaks.fma_isa or 'no loop'}), reads {rate(peaks.read_gbps, 'GB/s')}. The floor "
        "of a step is the largest of its weights x rows at the int8 peak, its attention at "
        "the FMA peak and its bytes (every weight, the document's KV once) at the read peak: "
        "a lower bound. Beside it, the kernels' own best int8 rate here (a Q5_0 product of "
        f"64 rows, kernel_rate.py): {kernels}."
    )


def floor_markdown(records: list[TrialRecord], setup: dict[str, Any]) -> str:
    """The floor table: measured ms/step, its floor and the bound that sets it, x floor."""
    if not (setup.get("peaks") and setup.get("model_shape")):
        return ""
    peaks = HardwarePeaks(**setup["peaks"])
    shape = ModelShape(**setup["model_shape"])
    lines = [
        "## How far from the floor",
        "",
        _peaks_line(peaks, setup.get("int8_gmacs")),
        "",
        "| config | mode | rows/step | ms/step | floor ms | bound | x floor |",
        "|---|---|--:|--:|--:|---|--:|",
    ]
    groups: dict[tuple[str, str], list[TrialRecord]] = {}
    for r in records:
        if not r.is_warmup and "gen_ms_per_step" in r.extra:
            groups.setdefault((r.config_id, r.mode), []).append(r)
    for (cfg, mode), rs in sorted(groups.items()):
        step = statistics.median(r.extra["gen_ms_per_step"] for r in rs)
        floor = step_floor(rs[0], shape, peaks)
        x = f"{step / floor.floor_ms:.1f}" if floor.floor_ms else "-"
        cell = f"{floor.floor_ms:.1f}" if floor.floor_ms else "not measured"
        lines.append(
            f"| {cfg} | {mode} | {rows_per_step(rs[0])} | {step:.1f} | {cell} | "
            f"{floor.bound} | {x} |"
        )
    return "\n".join(lines) + "\n"
