"""`perf record` attached to this process for one phase, and its samples grouped by ggml op.

The installed libraries are stripped; their unstripped twins (same build id) stay in the build
folder, and `perf report --symfs` is pointed at a folder of links that puts each twin where
perf expects the installed file, so template kernels such as tinyBLAS resolve by name.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# First match wins: the kernel names of the pinned ggml CPU backend, grouped by the op
# (and for MUL_MAT the kernel family) that calls them.
OP_PATTERNS: list[tuple[str, str]] = [
    # ggml_fa_bi_*: the batch-invariant attention of patches 0005 and 0010, whose row walk the
    # compiler may keep out of line (then no flash_attn-named frame holds its samples)
    (r"flash_attn|ggml_fa_bi_|vec_dot_f16|vec_mad_f|vec_scale|expf|softmax", "FLASH_ATTN_EXT"),
    (r"swarmkv_skinny", "MUL_MAT skinny GEMM (patch 0004)"),
    (r"tinyBLAS|llamafile_sgemm", "MUL_MAT llamafile sgemm"),
    (r"gemm_q|gemv_q|repack|tiled", "MUL_MAT repacked/tiled"),
    (r"_q8_K_rows|mul_mat_rows_chunk", "MUL_MAT K-quant rows (patch 0008)"),
    (r"vec_dot_q|vec_dot_iq|forward_mul_mat", "MUL_MAT vec_dot"),
    (r"quantize_row|quantize_mat|from_float", "MUL_MAT quantize activations"),
    (r"get_rows", "GET_ROWS"),
    (r"norm", "RMS_NORM"),
    (r"rope", "ROPE"),
    (r"gelu|glu|silu", "GELU/GLU"),
    (r"barrier|gomp|omp_|sched_yield|graph_compute|thread", "thread sync (spin at barriers)"),
    (r"forward_(add|mul|scale|cpy|dup|set_rows|cont)|vec_(add|mul|cpy)", "elementwise and copies"),
]


class PerfError(RuntimeError):
    """perf is missing, may not attach, or wrote nothing."""


def classify(dso: str, symbol: str) -> str:
    """The op group a sampled symbol belongs to."""
    for pattern, op in OP_PATTERNS:
        if re.search(pattern, symbol):
            return op
    if dso.startswith("libgomp"):
        return "thread sync (spin at barriers)"
    if dso.startswith("libm."):
        return "libm (expf: softmax in attention)"
    if "python" in dso or dso.startswith("_llama"):
        return "python and binding"
    return "other (libc, kernel, unresolved)"


@dataclass
class Profile:
    """Samples of one `perf record` run, filled in when its with-block ends: (share 0..1,
    dso, symbol) for every sampled symbol, largest first."""

    rows: list[tuple[float, str, str]] = field(default_factory=list)

    def top_symbols(self, k: int) -> list[dict[str, Any]]:
        """The k symbols with most samples."""
        return [{"share": s, "dso": d, "symbol": sym} for s, d, sym in self.rows[:k]]


def read_samples(data: Path, build_dir: Path) -> list[tuple[float, str, str]]:
    """perf report of data by (dso, symbol), symbols read from the unstripped twins."""
    with tempfile.TemporaryDirectory() as root:
        _link_twins(data, build_dir, Path(root))
        report = _perf(
            ["report", "-i", str(data), "--stdio", "--no-children", "-q",
             "--sort", "dso,symbol", "--percent-limit", "0", f"--symfs={root}"]
        )  # fmt: skip
    rows = []
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.*)$", line)
        if m:
            symbol = re.sub(r"(\s+-)+\s*$", "", m.group(3)).strip()  # perf's empty columns
            rows.append((float(m.group(1)) / 100, m.group(2), symbol))
    if not rows:
        raise PerfError(f"perf recorded no samples in {data}")
    return sorted(rows, reverse=True)


def _link_twins(data: Path, build_dir: Path, root: Path) -> None:
    # --symfs=root makes perf open root/<path> for each recorded file: link the build folder's
    # unstripped twin there where one exists, the file itself otherwise.
    for line in _perf(["buildid-list", "-i", str(data)]).splitlines():
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or not parts[1].startswith("/"):
            continue
        installed = Path(parts[1])
        twin = build_dir / installed.name
        link = root / installed.relative_to("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(twin if twin.is_file() else installed)


def op_table(samples: list[tuple[float, str, str]], phase_ms: float) -> list[dict[str, Any]]:
    """Share and ms per op group (phase_ms split by sample share), largest first."""
    total: dict[str, float] = {}
    for share, dso, symbol in samples:
        op = classify(dso, symbol)
        total[op] = total.get(op, 0.0) + share
    rows = [{"op": op, "share": s, "ms": s * phase_ms} for op, s in total.items()]
    return sorted(rows, key=lambda r: -r["share"])


@contextmanager
def profile(build_dir: Path, freq: int = 2000) -> Iterator[Profile]:
    """Record this process (every thread alive now) while the with-block runs."""
    if shutil.which("perf") is None:
        raise PerfError("perf is not installed (Debian: apt install linux-perf)")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        cmd = ["perf", "record", "-q", "-F", str(freq), "-p", str(os.getpid()), "-o", str(data)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # perf needs a moment to attach to every thread
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise PerfError(f"perf record failed ({err.strip()[:300]}); see perf_event_paranoid")
        prof = Profile()
        try:
            yield prof
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        if not data.exists():
            raise PerfError("perf record wrote no data")
        prof.rows = read_samples(data, build_dir)


def _perf(args: list[str]) -> str:
    proc = subprocess.run(["perf", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PerfError(f"perf {args[0]} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout
