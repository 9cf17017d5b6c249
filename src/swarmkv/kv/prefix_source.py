"""SnapshotSource: a saved prefix a pipeline's document starts from, checked before any run.

A source is an in-memory KVSnapshot (the caller keeps owning it) or a `.swkv` file (its
header is read and checked when the pipeline is built; its state is mapped shared, read
only, for the run: see KVSnapshot.open_shared). A document that starts with the snapshot's
tokens reuses them: the run restores the snapshot and prefills only the rest.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .file import check_context, check_model

if TYPE_CHECKING:
    from ..llama.model import Model
    from .snapshot import KVSnapshot

log = logging.getLogger("swarmkv.pipeline.builder")


@dataclass(frozen=True)
class SnapshotSource:
    """What a prefix snapshot holds (tokens, model, context settings) and where it is."""

    tokens: tuple[int, ...]
    model_fingerprint: str
    model_name: str
    context: Mapping[str, Any]
    path: Path | None = None
    snapshot: KVSnapshot | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def of(value: KVSnapshot | str | os.PathLike[str]) -> SnapshotSource:
        """A source from a KVSnapshot or a `.swkv` path (its header read and checked now)."""
        if isinstance(value, str | os.PathLike):
            from .snapshot import read_snapshot_header  # the header reader only: no state

            path = Path(value).expanduser()
            header = read_snapshot_header(path)
            return SnapshotSource(
                header.tokens, header.model_fingerprint, header.model_name, header.context, path
            )
        if value.on_device:
            raise ConfigError(
                "an ON_DEVICE snapshot cannot seed a pipeline (it lives in its context)"
            )
        if value.context is None:
            raise ConfigError("this snapshot has no context settings recorded: capture() it")
        _ = value.data  # a released snapshot is refused here, not in a node thread
        return SnapshotSource(
            value.tokens, value.model_fingerprint, value.model_name, value.context, None, value
        )

    @property
    def where(self) -> str:
        """How messages name this source."""
        return str(self.path) if self.path is not None else "snapshot"

    def check(self, model: Model, settings: Mapping[str, Any]) -> None:
        """SnapshotMismatchError unless model and a context with settings can restore it."""
        theirs = (self.model_fingerprint, self.model_name)
        check_model(theirs, self.where, model.fingerprint, model.path.name)
        check_context(self.context, self.where, settings)

    def reusable(self, doc_tokens: Sequence[int]) -> int:
        """How many of doc_tokens the snapshot serves: the tokens both start with.

        All of the snapshot's when the document starts with them. Fewer when they part
        earlier (often at the seam: a document extended after a newline tokenizes "\n\n" as
        one token): the run then restores the snapshot and drops its tail, which is exact
        when the snapshot holds every cell (swa_full, or no sliding window); otherwise, and
        when nothing is shared, nothing is reused and the whole document is prefilled.
        """
        n = len(self.tokens)
        same = next(
            (i for i, (a, b) in enumerate(zip(self.tokens, doc_tokens, strict=False)) if a != b),
            min(n, len(doc_tokens)),
        )
        if same == n:
            return n
        # a window-sized SWA cache has dropped cells the tail's removal would need again
        if same > 0 and self.context.get("swa_full") is True:
            log.info(
                "%s: reusing %d of its %d tokens (the document differs after)", self.where, same, n
            )
            return same
        log.warning(
            "%s holds %d tokens, the document shares only its first %d: nothing reused, the "
            "whole document is prefilled",
            self.where,
            n,
            same,
        )
        return 0

    def open(self) -> tuple[KVSnapshot, bool]:
        """The snapshot to restore, and whether the caller owns it (must release it)."""
        if self.snapshot is not None:
            return self.snapshot, False
        from .snapshot import KVSnapshot

        assert self.path is not None
        snap = KVSnapshot.open_shared(self.path)
        if snap.tokens != self.tokens or snap.model_fingerprint != self.model_fingerprint:
            snap.release()
            raise ConfigError(f"{self.path} changed since the pipeline read it")
        return snap, True
