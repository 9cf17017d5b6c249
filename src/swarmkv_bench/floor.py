"""How far a generation step is from what the hardware allows, per config and mode.

Bytes: a step reads every weight at least once, so model_bytes over the memory bandwidth
measured on this machine (a memcpy: read + write traffic over its time, one thread) bounds
it from below; the KV cells a step reads come on top and are not counted, so the floor is
a lower bound. Arithmetic: params multiply-adds per row (token) in the step, at the int8 rate
this build's weight kernels reach on this machine (kernel_rate.int8_gmacs, measured by the
bench), bounds it too; attention's f32 work is not counted. The floor is the larger of the
two, and the table says how far the measured step is from it.
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
    """The floor table: measured ms/step, the weights-read and arithmetic floors, x floor,
    GFLOP/s achieved."""
    if not all(setup.get(k) for k in ("model_bytes", "model_params", "memcpy_gbps")):
        return ""
    model_bytes, params = setup["model_bytes"], setup["model_params"]
    gbps, rate = setup["memcpy_gbps"], setup.get("int8_gmacs")
    read_ms = model_bytes / (gbps * 1e6)
    arith = (
        f"Arithmetic: one multiply-add per parameter and token row, at the {rate:.1f} G/s "
        "this build's int8 weight kernels reach here (a Q5_0 product of 64 rows that fits in "
        "L2, bench/swarmkv_bench/kernel_rate.py: the kernels' best, not the CPU's peak); "
        "attention's f32 work is not counted."
        if rate
        else "Arithmetic: the int8 rate was not measured in this run, so no arithmetic floor."
    )
    lines = [
        "## How far from the floor",
        "",
        f"A step reads every weight once: {model_bytes / 2**20:.0f} MiB at the measured "
        f"{gbps:.1f} GB/s memcpy rate is {read_ms:.1f} ms (KV reads not "
        f"counted). {arith} The floor is the larger of the two, so a lower bound.",
        "",
        "| config | mode | rows/step | ms/step | read floor ms | int8 floor ms | x floor "
        "| GFLOP/s |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    groups: dict[tuple[str, str], list[TrialRecord]] = {}
    for r in records:
        if not r.is_warmup and "gen_ms_per_step" in r.extra:
            groups.setdefault((r.config_id, r.mode), []).append(r)
    for (cfg, mode), rs in sorted(groups.items()):
        step = statistics.median(r.extra["gen_ms_per_step"] for r in rs)
        rows = rows_per_step(rs[0])
        arith_ms = params * rows / (rate * 1e6) if rate else None  # params multiply-adds a row
        floor_ms = max(read_ms, arith_ms or 0.0)
        gflops = 2 * params * rows / (step * 1e6) if step > 0 else float("nan")
        arith_cell = f"{arith_ms:.1f}" if arith_ms is not None else "not measured"
        lines.append(
            f"| {cfg} | {mode} | {rows} | {step:.1f} | {read_ms:.1f} | {arith_cell} | "
            f"{step / floor_ms:.1f} | {gflops:.1f} |"
        )
    return "\n".join(lines) + "\n"
