"""RunLedger: records from many node threads at once are all kept; snapshots released once."""

from __future__ import annotations

import threading

from swarmkv import Context, Model
from swarmkv.pipeline.handoff.ledger import RunLedger


class FakeSnapshot:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.released = 0

    def release(self) -> None:
        self.released += 1


def test_concurrent_records_are_all_kept() -> None:
    ledger = RunLedger()
    snaps = [FakeSnapshot(i) for i in range(64)]
    start = threading.Barrier(8)

    def node(k: int) -> None:
        start.wait()
        for i in range(k, 64, 8):
            ledger.prefill_done(i)
            ledger.keep_snapshot(snaps[i])  # type: ignore[arg-type]
            ledger.prefix_ready(i, share_ns=2 * i)

    threads = [threading.Thread(target=node, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ledger.prefill_median_ns() == 31  # median of 0..63, truncated
    assert all(ledger.share_ns(i) == 2 * i and ledger.ready_ns(i) > 0 for i in range(64))
    assert ledger.share_ns(99) == 0
    ledger.release_snapshots()
    ledger.release_snapshots()  # forgotten after the first: nothing is released twice
    assert [s.released for s in snaps] == [1] * 64


def test_full_snapshot_sets_the_run_size() -> None:
    ledger = RunLedger()
    assert ledger.snapshot_bytes == 0 and ledger.kv_bytes is None
    ledger.keep_snapshot(FakeSnapshot(10))  # type: ignore[arg-type]
    ledger.keep_snapshot(FakeSnapshot(99), full=True)  # type: ignore[arg-type]
    assert ledger.snapshot_bytes == 99


def test_kv_bytes_is_the_most_kv_allocated_at_once_by_llama_cpps_accounting(
    tiny_model: Model,
) -> None:
    """Context.memory_bytes reads llama.cpp's buffers (patch 0006): the KV buffer doubles with
    the cells; the ledger's kv_bytes is the largest sum over contexts open together."""
    ledger = RunLedger()
    with Context(tiny_model, n_ctx=256) as small, Context(tiny_model, n_ctx=512) as big:
        s, b = small.memory_bytes(), big.memory_bytes()
        assert s.kv > 0 and b.kv == 2 * s.kv
        assert s.model == b.model > 0 and s.compute > 0
        ledger.context_opened(small)
        ledger.context_opened(big)
        assert ledger.kv_bytes == s.kv + b.kv
    with Context(tiny_model, n_ctx=256) as again:  # the two above are closed: not counted
        ledger.context_opened(again)
    assert ledger.kv_bytes == s.kv + b.kv
    fresh = RunLedger()
    with Context(tiny_model, n_ctx=256) as one:
        fresh.context_opened(one)
    assert fresh.kv_bytes == s.kv
