"""device mode: the prefix is copied inside one context's device memory, never via the host.

Like fork with one KV stream per sequence, but each branch gets the prefix through
llama.cpp's ON_DEVICE sequence state (LLAMA_STATE_SEQ_FLAGS_ON_DEVICE): capturing seq 0
copies its KV data into buffers on the context's own device and writes only metadata to the
host buffer; restoring copies those buffers into the branch's stream. On a GPU this keeps
the document's KV off PCIe; on the CPU it is a memory-to-memory copy, and it stays exact.
"""

from __future__ import annotations

import time

from ...errors import ConfigError
from ...kv.snapshot import capture, restore
from ...llama.context import Context
from ..modes import ForkOptions
from .base import Plan
from .fork import ForkHandoff


class DeviceHandoff(ForkHandoff):
    """Branches in one context, one KV stream each, the prefix restored on device."""

    name = "device"

    def __init__(self, options: ForkOptions) -> None:
        # a restored state lands in the branch's own stream: one stream per sequence
        super().__init__(ForkOptions("streams", options.packing))
        self.share = share_on_device

    def check_start(self) -> None:
        """A snapshot records one KV stream; this mode keeps one per sequence."""
        raise ConfigError(
            "device mode keeps one KV stream per sequence and cannot restore a snapshot (it "
            "records one stream): start it from the document, or use fork or host"
        )


def share_on_device(plan: Plan, ctx: Context, seqs: list[int], w: int) -> None:
    """Capture seq 0 (its first w tokens, all it holds now) on device, restore it into each
    branch sequence, then drop the capture (the next one would overwrite it anyway)."""
    if not seqs:
        plan.ledger.prefix_ready(w)
        return
    t = time.perf_counter_ns()
    snap = capture(ctx, 0, plan.pool, tuple(plan.doc_tokens[:w]), on_device=True)
    try:
        for s in seqs:
            restore(ctx, s, snap)
    finally:
        snap.release()
    plan.ledger.prefix_ready(w, share_ns=(time.perf_counter_ns() - t) // len(seqs))
