"""RunLedger: what a run's node threads record as they go, behind one lock.

The prefill node and every branch node (each on its own worker thread) report timings,
snapshot sizes and the snapshots to release into the ledger; Pipeline.run reads it after
the DAG has joined them all. Every read and write holds the lock, so no thread sees a
half-updated dict and no append is lost.
"""

from __future__ import annotations

import statistics
import threading
import time
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...kv.snapshot import KVSnapshot
    from ...llama.context import Context


class RunLedger:
    """Timings, byte counts and captured snapshots of one run; safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prefill_ns: list[int] = []
        self._ready_ns: dict[int, int] = {}  # prefix length -> when branches could read it
        self._share_ns: dict[int, int] = {}  # fork: seq_cp time per branch, per prefix length
        self._snapshots: list[KVSnapshot] = []
        self._snapshot_bytes = 0
        self._kv_bytes: int | None = None
        self._open: list[tuple[weakref.ref[Context], int]] = []  # contexts and their KV bytes

    # -- writers (node threads) -----------------------------------------------------------
    def prefill_done(self, elapsed_ns: int) -> None:
        """Record one document prefill's duration (one per context that prefilled it)."""
        with self._lock:
            self._prefill_ns.append(elapsed_ns)

    def prefix_ready(self, n_tokens: int, share_ns: int | None = None) -> None:
        """Mark the first n_tokens as readable now (and, for fork, the per-branch share cost)."""
        now = time.perf_counter_ns()
        with self._lock:
            self._ready_ns[n_tokens] = now
            if share_ns is not None:
                self._share_ns[n_tokens] = share_ns

    def keep_snapshot(self, snap: KVSnapshot, full: bool = False, owned: bool = True) -> None:
        """Hold snap until release_snapshots() (owned=False: only note it, its owner releases
        it); full=True: its size is the run's snapshot size."""
        with self._lock:
            if owned:
                self._snapshots.append(snap)
            if full:
                self._snapshot_bytes = snap.nbytes

    def context_opened(self, ctx: Context) -> None:
        """Count ctx's KV buffers as llama.cpp accounts them; kv_bytes is then the largest
        sum over the contexts open at once (KV memory only grows when a context opens)."""
        kv = ctx.memory_bytes().kv
        with self._lock:
            self._open = [(r, n) for r, n in self._open if _is_open(r)]
            self._open.append((weakref.ref(ctx), kv))
            self._kv_bytes = max(self._kv_bytes or 0, sum(n for _, n in self._open))

    # -- readers --------------------------------------------------------------------------
    def ready_ns(self, n_tokens: int) -> int:
        """When the first n_tokens became readable (prefix_ready must have been called)."""
        with self._lock:
            return self._ready_ns[n_tokens]

    def share_ns(self, n_tokens: int) -> int:
        """Fork: the seq_cp time per branch at that prefix length, 0 when not recorded."""
        with self._lock:
            return self._share_ns.get(n_tokens, 0)

    def prefill_median_ns(self) -> int:
        """Median prefill duration, 0 when no prefill finished."""
        with self._lock:
            return int(statistics.median(self._prefill_ns)) if self._prefill_ns else 0

    @property
    def snapshot_bytes(self) -> int:
        """Bytes of the full document's snapshot (host mode), else 0."""
        with self._lock:
            return self._snapshot_bytes

    @property
    def kv_bytes(self) -> int | None:
        """The most KV buffer bytes allocated at once (llama.cpp's accounting), None before
        any context opened."""
        with self._lock:
            return self._kv_bytes

    def release_snapshots(self) -> None:
        """Release every snapshot kept and forget them (after every node thread has ended)."""
        with self._lock:
            snaps, self._snapshots = self._snapshots, []
        for snap in snaps:
            snap.release()


def _is_open(ref: weakref.ref[Context]) -> bool:
    ctx = ref()
    return ctx is not None and not ctx.closed
