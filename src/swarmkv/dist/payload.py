"""A snapshot as a Ray object: its state bytes as one numpy view plus a small header.

The driver puts `snapshot_payload(snap)` into Ray's object store once: the state is a
zero-copy numpy view of the pool buffer (or of a shared file mapping), which pickle protocol
5 hands to Ray out of band, so the only copy the driver makes is the one into the store. A
worker's `ray.get` returns a read-only numpy array backed by the store's shared memory, and
`snapshot_from_payload` wraps it as a KVSnapshot without copying; restore reads it in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SnapshotMismatchError
from ..kv.file import payload_digest
from ..kv.snapshot import KVSnapshot

PAYLOAD_VERSION = 1


class ArrayState:
    """Snapshot bytes held by a (read-only) numpy uint8 array: Ray's zero-copy view."""

    def __init__(self, array: np.ndarray) -> None:
        if array.dtype != np.uint8 or array.ndim != 1:
            raise SnapshotMismatchError(
                f"snapshot payload state must be a 1-D uint8 array, got {array.dtype} "
                f"with {array.ndim} dimensions"
            )
        self._array: np.ndarray | None = array
        self.nbytes = int(array.nbytes)

    @property
    def view(self) -> memoryview:
        """The state bytes; SnapshotMismatchError once released."""
        if self._array is None:
            raise SnapshotMismatchError("snapshot payload used after release")
        return self._array.data  # a memoryview of the array, no copy

    @property
    def released(self) -> bool:
        """Whether release() dropped the array."""
        return self._array is None

    def release(self) -> None:
        """Drop the reference (idempotent): Ray unpins the object once no view holds it."""
        self._array = None


def snapshot_payload(snap: KVSnapshot) -> dict[str, Any]:
    """What the driver puts into the object store: header fields and a zero-copy state view."""
    if snap.on_device:
        raise SnapshotMismatchError(
            "an ON_DEVICE snapshot's KV data lives in its context: it cannot be sent to workers"
        )
    if snap.context is None:
        raise SnapshotMismatchError("this snapshot has no context settings recorded")
    return {
        "version": PAYLOAD_VERSION,
        "tokens": list(snap.tokens),
        "model_fingerprint": snap.model_fingerprint,
        "model_name": snap.model_name,
        "flags": snap.flags,
        "context": dict(snap.context),
        "sha256": payload_digest(snap.data),
        "state": np.frombuffer(snap.data, dtype=np.uint8),
    }


def snapshot_from_payload(payload: dict[str, Any], *, verify: bool = True) -> KVSnapshot:
    """The worker's KVSnapshot over the payload's state, not copied; verify=True checks the
    state's sha256 against the driver's (it reads every byte once)."""
    version = payload.get("version")
    if version != PAYLOAD_VERSION:
        raise SnapshotMismatchError(
            f"snapshot payload version {version!r}, this swarmkv reads {PAYLOAD_VERSION}"
        )
    state = ArrayState(payload["state"])
    if verify and payload_digest(state.view) != payload["sha256"]:
        raise SnapshotMismatchError("snapshot payload state checksum mismatch (corrupt)")
    return KVSnapshot(
        state,
        tuple(payload["tokens"]),
        payload["model_fingerprint"],
        payload["flags"],
        context=payload["context"],
        model_name=payload["model_name"],
    )
