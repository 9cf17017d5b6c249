"""Handoff mode names and options: plain data, importable without the native library.

The modes themselves (what each does with contexts and KV state) are in swarmkv.pipeline.handoff.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

MODES = ("host", "fork", "device", "baseline")


@dataclass(frozen=True)
class ForkOptions:
    """How fork mode lays out KV and packs decodes (measured alternatives: docs/results/).

    layout "unified": one KV buffer; branches share the prefix cells (zero copy).
           "streams": one KV stream per sequence; seq_cp copies the prefix into each.
    packing "batched": all branches in one decode per step.
            "per_branch": one decode per branch per step.
    With batch-invariant kernels (Pipeline(exact=True), the default) every combination
    reproduces the baseline bit for bit, and unified + batched is the fastest. Without them
    only streams + per_branch does; unified + batched then matches it except at near-ties.
    """

    layout: str = "unified"
    packing: str = "batched"

    def validate(self) -> None:
        """Raise ConfigError for a layout or packing this mode does not know."""
        if self.layout not in ("unified", "streams"):
            raise ConfigError(f"fork layout must be 'unified' or 'streams', got {self.layout!r}")
        if self.packing not in ("batched", "per_branch"):
            raise ConfigError(
                f"fork packing must be 'batched' or 'per_branch', got {self.packing!r}"
            )
