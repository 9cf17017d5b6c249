"""What this CPU can do at best, measured in the same run as the steps it bounds.

Three rates, each with every thread the benchmark uses, each the best of a few runs:
  - int8 multiply-adds per second: a register-only loop of the best instruction the CPU has
    (AVX-512 VNNI, AVX-VNNI, else AVX2's vpmaddubsw sequence), the arithmetic ceiling of any
    quantized weight kernel;
  - f32 FMAs per second: a register-only FMA loop (AVX-512F, else AVX2), attention's ceiling;
  - read bandwidth: every thread streaming its share of a buffer far larger than the caches.
The loops are C (swarmkv/_native/peak.c, compiled into the binding), picked by what the CPU
reports at run time, not by what the build was compiled for: a floor is the hardware's, not
these kernels'. The kernels' own best rate (kernel_rate.py) is reported beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

READ_BYTES = 512 * 2**20  # far past any L3 here (32 MiB)
TARGET_S = 0.25  # each timed run, about


@dataclass(frozen=True)
class HardwarePeaks:
    """Peak rates of this CPU with `threads` threads (None: no loop for this CPU)."""

    threads: int
    int8_isa: str
    int8_gmacs: float | None  # G multiply-adds per second
    fma_isa: str
    fma_gfmas: float | None  # G fused multiply-adds per second (f32)
    read_gbps: float | None  # GB per second read

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _together(threads: int, work: Callable[[int], int]) -> tuple[int, float]:
    """Run work(i) on `threads` threads at once; (sum of what they return, wall seconds)."""
    done = [0] * threads
    start = threading.Barrier(threads + 1)

    def body(i: int) -> None:
        start.wait()
        done[i] = work(i)

    pool = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return sum(done), time.perf_counter() - t0


def _best_rate(threads: int, fn: Callable[[int], int], reps: int) -> float | None:
    """G operations per second of fn(iters) on every thread, best of reps; the iteration
    count sized from one short run so each timed run takes about TARGET_S."""
    ops, secs = _together(1, lambda _i: fn(1000))
    if ops == 0:
        return None
    iters = max(1000, int(1000 * TARGET_S / max(secs, 1e-6)))
    best = 0.0
    for _ in range(reps):
        ops, secs = _together(threads, lambda _i: fn(iters))
        best = max(best, ops / secs / 1e9)
    return best


def _read_gbps(threads: int, reps: int) -> float | None:
    from swarmkv._native import ffi, lib

    raw = np.ones(READ_BYTES + 64, dtype=np.uint8)  # touched: every page is resident
    base = (-raw.ctypes.data) % 64
    buf = raw[base : base + READ_BYTES]
    share = READ_BYTES // threads // 64 * 64
    ptr = ffi.cast("char *", buf.ctypes.data)

    def work(i: int) -> int:
        return int(lib.swarmkv_peak_read(ptr + i * share, share, 2))

    best = 0.0
    for _ in range(reps + 1):  # the first pass warms the TLB and the prefetchers
        nbytes, secs = _together(threads, work)
        if nbytes == 0:
            return None
        best = max(best, nbytes / secs / 1e9)
    return best


def best_of(peaks: list[HardwarePeaks]) -> HardwarePeaks:
    """The largest of each rate over several measurements of one run: on a shared virtual
    machine the same two vCPUs gave 233 and 445 G int8 multiply-adds/s minutes apart (two
    cores or two threads of one), and a floor is a lower bound, so the faster reading counts."""

    def top(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    first = peaks[0]
    return HardwarePeaks(
        threads=first.threads,
        int8_isa=first.int8_isa,
        int8_gmacs=top([p.int8_gmacs for p in peaks]),
        fma_isa=first.fma_isa,
        fma_gfmas=top([p.fma_gfmas for p in peaks]),
        read_gbps=top([p.read_gbps for p in peaks]),
    )


def measure_peaks(threads: int, reps: int = 5) -> HardwarePeaks:
    """The three peak rates on `threads` threads (see the module docstring)."""
    from swarmkv._native import ffi, lib

    return HardwarePeaks(
        threads=threads,
        int8_isa=ffi.string(lib.swarmkv_peak_int8_isa()).decode(),
        int8_gmacs=_best_rate(threads, lambda n: int(lib.swarmkv_peak_int8(n)), reps),
        fma_isa=ffi.string(lib.swarmkv_peak_fma_isa()).decode(),
        fma_gfmas=_best_rate(threads, lambda n: int(lib.swarmkv_peak_fma(n)), reps),
        read_gbps=_read_gbps(threads, reps),
    )
