"""KVSnapshot: one sequence's KV state as bytes, plus what it is of.

A snapshot records the model fingerprint, the prefix token ids and the context settings its
state depends on, so restoring it into another model's context or an incompatible one is
refused in Python before any byte reaches llama.cpp. Its bytes live in a pool buffer
(capture, load) or in a read-only shared mapping of a `.swkv` file (open_shared: every
process that maps one file shares one copy in the page cache). File format: snapshot_file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from .._native import BUILD, LLAMA_CPP_COMMIT, lib
from ..errors import PoolError, SnapshotMismatchError, SwarmKVError
from ..llama.context import Context
from ..llama.kvmath import mem_available_bytes
from ..llama.pool import HostBufferPool
from .file import (
    STATE_MAGIC,
    SnapshotHeader,
    check_build,
    check_context,
    check_model,
    check_state,
    check_state_start,
    encode,
    open_snapshot_file,
    payload_digest,
    read_file_header,
    read_header,
    write_atomically,
)


class StateBytes(Protocol):
    """Where a snapshot's bytes live: a pool HostBuffer or a MappedState."""

    nbytes: int

    @property
    def view(self) -> memoryview: ...

    @property
    def released(self) -> bool: ...

    def release(self) -> None: ...


class MappedState:
    """A read-only shared mapping of a snapshot file's state bytes (mmap, MAP_SHARED).

    Processes that map the same file read the same page-cache pages: N workers restoring
    one snapshot hold one copy of it, not N.
    """

    def __init__(self, f: Any, offset: int, nbytes: int) -> None:
        self._map: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.nbytes = nbytes
        self._view: memoryview | None = memoryview(self._map)[offset : offset + nbytes]

    @property
    def view(self) -> memoryview:
        """The state bytes (read-only); SnapshotMismatchError once released."""
        if self._view is None:
            raise SnapshotMismatchError("snapshot mapping used after release")
        return self._view

    @property
    def released(self) -> bool:
        """Whether release() has unmapped (or given up) the state."""
        return self._view is None

    def release(self) -> None:
        """Unmap (idempotent); a view still held elsewhere keeps the mapping until it goes."""
        view, self._view = self._view, None
        if view is not None:
            view.release()
        if self._map is not None:
            # a slice made from the view may be alive: the mapping then closes when it goes
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None


@dataclass
class KVSnapshot:
    """State bytes of a prefix of `n_tokens` tokens; owns its buffer (release() frees it).

    `context` holds the context settings the state depends on (snapshot_file.CONTEXT_FIELDS);
    a restoring context must match them.
    """

    buffer: StateBytes
    tokens: tuple[int, ...]
    model_fingerprint: str
    flags: int = 0
    capture_ms: float | None = None
    context: Mapping[str, Any] | None = None
    model_name: str = ""
    source: Path | None = None  # the file it was loaded from, if any
    device_of: Any = field(default=None, repr=False)  # ON_DEVICE: (context, generation)

    @property
    def n_tokens(self) -> int:
        """Length of the prefix the state holds, in tokens."""
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Size of the state bytes (the buffer's nbytes, not its capacity)."""
        return self.buffer.nbytes

    @property
    def data(self) -> memoryview:
        """The state bytes as a memoryview; an error once the snapshot is released."""
        return self.buffer.view

    @property
    def shared(self) -> bool:
        """Whether the bytes are a read-only shared mapping of a file (open_shared)."""
        return isinstance(self.buffer, MappedState)

    @property
    def on_device(self) -> bool:
        """Whether the KV data stayed in the context's device buffers (ON_DEVICE)."""
        return bool(self.flags & lib.LLAMA_STATE_SEQ_FLAGS_ON_DEVICE)

    def fork(self, pool: HostBufferPool) -> KVSnapshot:
        """Copy-on-fork: a private copy of the bytes for one branch."""
        return KVSnapshot(
            pool.copy_of(self.data),
            self.tokens,
            self.model_fingerprint,
            self.flags,
            context=self.context,
            model_name=self.model_name,
            device_of=self.device_of,
        )

    def release(self) -> None:
        """Give the buffer back (idempotent); data is unusable after."""
        self.buffer.release()

    def __enter__(self) -> KVSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- files ------------------------------------------------------------------------------
    def header(self) -> SnapshotHeader:
        """The `.swkv` header describing this snapshot (checksums computed now)."""
        if self.context is None:
            raise SnapshotMismatchError("this snapshot has no context settings recorded")
        return SnapshotHeader(
            model_fingerprint=self.model_fingerprint,
            tokens=self.tokens,
            state_flags=self.flags,
            nbytes=self.nbytes,
            sha256=payload_digest(self.data),
            context=self.context,
            llama_cpp_commit=LLAMA_CPP_COMMIT,
            patches=tuple(BUILD["patches"]),
            swarmkv_version=_version(),
            model_name=self.model_name,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write a `.swkv` file atomically (snapshot_file.write_atomically); returns its path."""
        if self.on_device:
            raise SnapshotMismatchError(
                "an ON_DEVICE snapshot's KV data lives in its context's device buffers, not "
                "in host memory: capture without on_device to save it"
            )
        return write_atomically(Path(path), encode(self.header()), self.data)

    @staticmethod
    def load(path: str | os.PathLike[str], pool: HostBufferPool) -> KVSnapshot:
        """Read a `.swkv` file into a pool buffer. Every check (format, header and its
        checksum, sizes, llama.cpp commit and patches, state checksum) runs before the state
        is used, and the state is allocated only once the file is known to hold it, to start
        like a llama.cpp state and to fit in the memory available (PoolError if not)."""
        path = Path(path)
        with open_snapshot_file(path) as f:
            header, offset = read_header(f, path)
            check_build(header, path, LLAMA_CPP_COMMIT, BUILD["patches"])
            check_state_start(f, offset, path)
            avail = mem_available_bytes()
            if avail is not None and header.nbytes > avail:
                raise PoolError(
                    f"{path}: its state of {header.nbytes} bytes exceeds the {avail} bytes of "
                    "memory available"
                )
            buf = pool.alloc(header.nbytes)
            try:
                f.seek(offset)
                got = f.readinto(buf.view)
                if got != header.nbytes or payload_digest(buf.view) != header.sha256:
                    raise SnapshotMismatchError(f"{path}: state checksum mismatch (corrupt)")
            except BaseException:
                buf.release()
                raise
        return _from_header(header, buf, path)

    @staticmethod
    def open_shared(path: str | os.PathLike[str], *, verify: bool = True) -> KVSnapshot:
        """Map a `.swkv` file read-only and shared: processes that open one file share one
        copy of its state. The same checks as load(); verify=False skips only the state
        checksum (it reads every page once)."""
        path = Path(path)
        with open_snapshot_file(path) as f:
            header, offset = read_header(f, path)
            check_build(header, path, LLAMA_CPP_COMMIT, BUILD["patches"])
            check_state_start(f, offset, path)
            state = MappedState(f, offset, header.nbytes)
        if verify and payload_digest(state.view) != header.sha256:
            state.release()
            raise SnapshotMismatchError(f"{path}: state checksum mismatch (corrupt)")
        return _from_header(header, state, path)


def _from_header(header: SnapshotHeader, state: StateBytes, path: Path) -> KVSnapshot:
    return KVSnapshot(
        state,
        header.tokens,
        header.model_fingerprint,
        header.state_flags,
        context=dict(header.context),
        model_name=header.model_name,
        source=path,
    )


def read_snapshot_header(path: str | os.PathLike[str]) -> SnapshotHeader:
    """The validated header of a `.swkv` file (no state read, nothing native)."""
    return read_file_header(Path(path))


def _version() -> str:
    from .._version import __version__

    return __version__


# -- capture and restore ------------------------------------------------------------------
def capture(
    ctx: Context,
    seq_id: int,
    pool: HostBufferPool,
    tokens: tuple[int, ...],
    flags: int | None = None,
    *,
    on_device: bool = False,
) -> KVSnapshot:
    """Export seq_id's state into a new pool buffer (llama_state_seq_get_data_ext).

    flags=None uses ctx.exact_state_flags, which makes a restore bit-exact. on_device=True
    adds LLAMA_STATE_SEQ_FLAGS_ON_DEVICE: the KV data is copied into buffers of the context's
    own device and only metadata reaches the host buffer; such a snapshot restores into the
    same context only, and a later on_device capture of seq_id invalidates it.
    """
    t0 = time.perf_counter_ns()
    if flags is None:
        flags = ctx.exact_state_flags
    if on_device:
        flags |= int(lib.LLAMA_STATE_SEQ_FLAGS_ON_DEVICE)
    held = ctx.seq_len(seq_id)
    if held != len(tokens):
        raise SnapshotMismatchError(
            f"seq {seq_id} holds {held} positions but the snapshot names {len(tokens)} tokens"
        )
    buf = pool.alloc(ctx.state_seq_size(seq_id, flags))
    try:
        ctx.state_seq_get(seq_id, buf.view, flags)
    except BaseException:
        buf.release()
        raise
    device_of = ctx.device_snapshot_taken(seq_id) if on_device else None
    ms = (time.perf_counter_ns() - t0) / 1e6
    return KVSnapshot(
        buf,
        tokens,
        ctx.model.fingerprint,
        flags,
        capture_ms=ms,
        context=ctx.state_settings(),
        model_name=ctx.model.path.name,
        device_of=device_of,
    )


def check_restorable(ctx: Context, snap: KVSnapshot) -> None:
    """Every check restore() makes before touching ctx; SnapshotMismatchError names the field."""
    where = snap.source or "snapshot"
    data = snap.data  # raises if released
    theirs = (snap.model_fingerprint, snap.model_name)
    check_model(theirs, where, ctx.model.fingerprint, ctx.model.path.name)
    settings = ctx.state_settings()
    if snap.context is not None:
        check_context(snap.context, where, settings)
    if snap.n_tokens > ctx.n_ctx_seq:  # one sequence's cells, not the whole context's
        raise SnapshotMismatchError(
            f"snapshot of {snap.n_tokens} tokens exceeds the {ctx.n_ctx_seq} cells of one "
            f"sequence (n_ctx={ctx.n_ctx}, n_seq_max={ctx.n_seq_max})"
        )
    if snap.on_device:
        # its KV data lives in the capturing context (llama.cpp GGML_ASSERTs on a source
        # sequence it holds no device copy of), so only that context's latest capture restores
        if len(data) < 8 or struct.unpack_from("<I", data)[0] != STATE_MAGIC:
            raise SnapshotMismatchError(f"{where}: the state does not start with llama.cpp's magic")
        src_seq = struct.unpack_from("<i", data, 4)[0]
        if snap.device_of is None or snap.device_of != ctx.device_snapshot_current(src_seq):
            raise SnapshotMismatchError(
                "an ON_DEVICE snapshot restores only into the context that captured it, and "
                "only until that context captures the same sequence on device again"
            )
        return
    # llama.cpp trusts the cell positions and counts it reads (snapshot_file.check_state)
    n_stream = settings["n_stream"]
    assert isinstance(n_stream, int)
    check_state(
        data, n_tokens=snap.n_tokens, n_stream=n_stream, n_layer=ctx.model.n_layer, where=where
    )


def restore(ctx: Context, seq_id: int, snap: KVSnapshot) -> float:
    """Load snap into seq_id of ctx (replacing what it held); returns milliseconds taken.

    Every check runs before seq_id is touched, so a refused snapshot leaves it as it was. If
    llama.cpp itself rejects the bytes, seq_id is left empty and other sequences untouched.
    """
    ctx.check_seq(seq_id)
    check_restorable(ctx, snap)
    t0 = time.perf_counter_ns()
    ctx.seq_rm(seq_id)
    try:
        ctx.state_seq_set(seq_id, snap.data, snap.flags)
        held = ctx.seq_len(seq_id)
        if held != snap.n_tokens:
            raise SnapshotMismatchError(
                f"restored seq {seq_id} holds {held} positions, snapshot has {snap.n_tokens} tokens"
            )
    except SwarmKVError:
        ctx.seq_rm(seq_id)  # never leave a half-restored sequence behind
        raise
    return (time.perf_counter_ns() - t0) / 1e6
