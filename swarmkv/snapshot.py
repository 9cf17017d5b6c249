"""KVSnapshot: one sequence's KV state as bytes in a pool buffer, plus what it is of.

A snapshot records the model fingerprint and the prefix token ids, so restoring it into a
context of another model, or saving and loading it across processes, is checked in Python
before any byte reaches llama.cpp.

File format (little endian): b"SWKV", u32 version, u32 header length, UTF-8 JSON header
(model_fingerprint, tokens, flags, nbytes, sha256, llama_cpp_commit), then nbytes of state.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._native import LLAMA_CPP_COMMIT
from .context import Context
from .errors import SnapshotMismatchError
from .pool import HostBuffer, HostBufferPool

_MAGIC = b"SWKV"
_VERSION = 1


@dataclass
class KVSnapshot:
    """State bytes of a prefix of `n_tokens` tokens; owns its pool buffer."""

    buffer: HostBuffer
    tokens: tuple[int, ...]
    model_fingerprint: str
    flags: int = 0
    capture_ms: float | None = None

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
        """The state bytes as a memoryview; PoolError once the snapshot is released."""
        return self.buffer.view

    def fork(self, pool: HostBufferPool) -> KVSnapshot:
        """Copy-on-fork: a private copy of the bytes for one branch."""
        return KVSnapshot(pool.copy_of(self.data), self.tokens, self.model_fingerprint, self.flags)

    def release(self) -> None:
        """Give the buffer back to its pool (idempotent); data is unusable after."""
        self.buffer.release()

    def save(self, path: str | os.PathLike[str], llama_cpp_commit: str | None = None) -> Path:
        """Write atomically: a temporary file in the same folder, fsync, rename, fsync of the
        folder. A crash at any point leaves either the old file or the new one under `path`,
        never half of one, and no temporary file is left behind by a failed save."""
        path = Path(path)
        header = json.dumps(
            {
                "model_fingerprint": self.model_fingerprint,
                "tokens": list(self.tokens),
                "flags": self.flags,
                "nbytes": self.nbytes,
                "sha256": hashlib.sha256(self.data).hexdigest(),
                "llama_cpp_commit": LLAMA_CPP_COMMIT
                if llama_cpp_commit is None
                else llama_cpp_commit,
            }
        ).encode()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(_MAGIC + struct.pack("<II", _VERSION, len(header)) + header)
                f.write(self.data)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)
        return path

    @staticmethod
    def load(path: str | os.PathLike[str], pool: HostBufferPool) -> KVSnapshot:
        """Read a snapshot file; every check (format, header, size, llama.cpp commit, checksum)
        runs before the bytes are used, and a failed load holds no pool memory."""
        path = Path(path)
        with path.open("rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] != _MAGIC:
                raise SnapshotMismatchError(f"{path} is not a SwarmKV snapshot")
            version, header_len = struct.unpack("<II", head[4:])
            if version != _VERSION:
                raise SnapshotMismatchError(
                    f"{path}: snapshot version {version}, expected {_VERSION}"
                )
            meta = _parse_header(path, f.read(header_len))
            _check_commit(path, meta)
            left = os.fstat(f.fileno()).st_size - f.tell()
            if left != meta["nbytes"]:  # before allocating: a header may claim any size
                raise SnapshotMismatchError(
                    f"{path}: payload truncated or padded: the header says {meta['nbytes']} "
                    f"bytes of state, the file holds {left}"
                )
            buf = pool.alloc(meta["nbytes"])
            try:
                got = f.readinto(buf.view)
                if got != meta["nbytes"] or hashlib.sha256(buf.view).hexdigest() != meta["sha256"]:
                    raise SnapshotMismatchError(
                        f"{path}: payload truncated or corrupt ({got} bytes read)"
                    )
            except BaseException:
                buf.release()
                raise
        return KVSnapshot(buf, tuple(meta["tokens"]), meta["model_fingerprint"], meta["flags"])


def _fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX: the folder's entry must reach the disk)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_commit(path: Path, meta: dict[str, Any]) -> None:
    # The state layout is llama.cpp's own and changes between versions: a snapshot from
    # another commit must not reach llama_state_seq_set_data. "" marks an unrecorded commit.
    theirs = meta.get("llama_cpp_commit", "")
    if not isinstance(theirs, str):
        raise SnapshotMismatchError(f"{path}: snapshot header lacks a valid 'llama_cpp_commit'")
    if theirs and theirs != LLAMA_CPP_COMMIT:
        raise SnapshotMismatchError(
            f"{path}: llama_cpp_commit is {theirs[:12]} in the file, this build runs "
            f"{LLAMA_CPP_COMMIT[:12]}"
        )


_HEADER_KEYS = {
    "model_fingerprint": str,
    "tokens": list,
    "flags": int,
    "nbytes": int,
    "sha256": str,
}


def _parse_header(path: Path, raw: bytes) -> dict[str, Any]:
    """The JSON header, every key present with its type, or SnapshotMismatchError."""
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotMismatchError(f"{path}: snapshot header is damaged ({exc})") from exc
    if not isinstance(meta, dict):
        raise SnapshotMismatchError(f"{path}: snapshot header is not an object")
    for key, kind in _HEADER_KEYS.items():
        if not isinstance(meta.get(key), kind):
            raise SnapshotMismatchError(f"{path}: snapshot header lacks a valid {key!r}")
    if meta["nbytes"] < 1:
        raise SnapshotMismatchError(f"{path}: snapshot header says {meta['nbytes']} bytes")
    return meta


def capture(
    ctx: Context,
    seq_id: int,
    pool: HostBufferPool,
    tokens: tuple[int, ...],
    flags: int | None = None,
) -> KVSnapshot:
    """Export seq_id's state into a new pool buffer (llama_state_seq_get_data_ext).

    flags=None uses ctx.exact_state_flags, which makes a restore bit-exact.
    """
    t0 = time.perf_counter_ns()
    if flags is None:
        flags = ctx.exact_state_flags
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
    ms = (time.perf_counter_ns() - t0) / 1e6
    return KVSnapshot(buf, tokens, ctx.model.fingerprint, flags, capture_ms=ms)


def restore(ctx: Context, seq_id: int, snap: KVSnapshot) -> float:
    """Load snap into seq_id of ctx (replacing what it held); returns milliseconds taken."""
    if snap.model_fingerprint != ctx.model.fingerprint:
        raise SnapshotMismatchError(
            f"snapshot was taken with model {snap.model_fingerprint[:12]}, "
            f"context runs {ctx.model.fingerprint[:12]} ({ctx.model.path.name})"
        )
    if snap.n_tokens > ctx.n_ctx_seq:  # one sequence's cells, not the whole context's
        raise SnapshotMismatchError(
            f"snapshot of {snap.n_tokens} tokens exceeds the {ctx.n_ctx_seq} cells of one "
            f"sequence (n_ctx={ctx.n_ctx}, n_seq_max={ctx.n_seq_max})"
        )
    t0 = time.perf_counter_ns()
    ctx.seq_rm(seq_id)
    ctx.state_seq_set(seq_id, snap.data, snap.flags)
    held = ctx.seq_len(seq_id)
    if held != snap.n_tokens:
        raise SnapshotMismatchError(
            f"restored seq {seq_id} holds {held} positions, snapshot has {snap.n_tokens} tokens"
        )
    return (time.perf_counter_ns() - t0) / 1e6
