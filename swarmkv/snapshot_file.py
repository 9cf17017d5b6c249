"""The SwarmKV snapshot file (`.swkv`): layout, header, checks. Pure Python, no native call.

Layout (little endian), version 2:

| offset       | size        | field                                                   |
|--------------|-------------|---------------------------------------------------------|
| 0            | 4           | magic `SWKV`                                            |
| 4            | 4 (u32)     | format version (2)                                      |
| 8            | 4 (u32)     | header length H in bytes                                |
| 12           | 8 (u64)     | state length N in bytes (repeated in the header)        |
| 20           | H           | header: UTF-8 JSON object (fields: `SnapshotHeader`)    |
| 20 + H       | 32          | sha256 of the H header bytes                            |
| 52 + H       | N           | llama.cpp's sequence state (llama_state_seq_get_data_ext)|

The header holds the format, swarmkv and llama.cpp versions (commit and patch set: the state
layout is llama.cpp's own), the model fingerprint, the context settings that decide whether
a context can take the state (`SnapshotHeader.context`), the prefix token ids, the state's
flags, its length and its sha256. Its own sha256 follows it, so a flipped bit anywhere in the
file is caught before anything is used. Every check here runs before a byte is allocated
for the state or handed to llama.cpp, and each failure is a SnapshotMismatchError naming the
field and both values.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from .errors import SnapshotMismatchError, SnapshotWriteError

MAGIC = b"SWKV"
VERSION = 2
PREFIX = struct.Struct("<4sIIQ")  # magic, version, header length, state length
DIGEST = 32
MAX_HEADER = 64 << 20  # 16M tokens of JSON; a larger claim is damage, never a real header
FORMAT = "swarmkv-kv-snapshot"


@dataclass(frozen=True)
class SnapshotHeader:
    """What a snapshot is of: the fields of a `.swkv` header (see the module table).

    `context` holds the settings a restoring context must share: KV types, flash attention
    (it decides whether V is stored transposed), swa_full (the SWA cache's size), the number
    of KV streams, and batch_invariant (the kernels that computed the state: exactness).
    """

    model_fingerprint: str
    tokens: tuple[int, ...]
    state_flags: int
    nbytes: int
    sha256: str
    context: Mapping[str, Any]
    llama_cpp_commit: str
    patches: tuple[str, ...]
    swarmkv_version: str = ""
    model_name: str = ""
    created: str = ""
    format: str = FORMAT

    @property
    def n_tokens(self) -> int:
        """Length of the prefix the state holds."""
        return len(self.tokens)

    def to_json(self) -> bytes:
        """The header as UTF-8 JSON (tuples as lists)."""
        data = asdict(self)
        data["tokens"] = list(self.tokens)
        data["patches"] = list(self.patches)
        data["context"] = dict(self.context)
        data["n_tokens"] = self.n_tokens
        return json.dumps(data, sort_keys=True).encode()


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "model_fingerprint": str,
    "tokens": list,
    "state_flags": int,
    "nbytes": int,
    "sha256": str,
    "context": dict,
    "llama_cpp_commit": str,
    "patches": list,
    "swarmkv_version": str,
    "model_name": str,
    "created": str,
    "n_tokens": int,
}
CONTEXT_FIELDS = ("batch_invariant", "type_k", "type_v", "flash_attn", "swa_full", "n_stream")


def encode(header: SnapshotHeader) -> bytes:
    """Everything before the state: fixed prefix, header JSON, header digest."""
    raw = header.to_json()
    return PREFIX.pack(MAGIC, VERSION, len(raw), header.nbytes) + raw + hashlib.sha256(raw).digest()


def payload_offset(header_len: int) -> int:
    """Where the state starts in a file whose header is header_len bytes."""
    return PREFIX.size + header_len + DIGEST


def read_header(f: IO[bytes], path: Path) -> tuple[SnapshotHeader, int]:
    """The validated header of an open snapshot file and the state's offset.

    Checks, in order: magic, version, header length against the file size, header digest,
    JSON and the type of every field, the state length against the prefix and the file size.
    Reads only the header: a header claiming any size allocates nothing more.
    """
    size = os.fstat(f.fileno()).st_size
    head = f.read(PREFIX.size)
    if len(head) < PREFIX.size or head[:4] != MAGIC:
        raise SnapshotMismatchError(f"{path} is not a SwarmKV snapshot (no SWKV magic)")
    _, version, header_len, nbytes = PREFIX.unpack(head)
    if version != VERSION:
        raise SnapshotMismatchError(
            f"{path}: format version is {version} in the file, this SwarmKV reads {VERSION}"
        )
    room = size - payload_offset(0)
    if header_len > min(room, MAX_HEADER):
        raise SnapshotMismatchError(
            f"{path}: header length is {header_len} bytes in the file, which holds only "
            f"{max(room, 0)} bytes after its fixed prefix (truncated or damaged)"
        )
    raw = f.read(header_len)
    digest = f.read(DIGEST)
    if hashlib.sha256(raw).digest() != digest:
        raise SnapshotMismatchError(f"{path}: header checksum mismatch (the header is damaged)")
    header = parse_header(raw, path)
    if header.nbytes != nbytes:
        raise SnapshotMismatchError(
            f"{path}: state length is {nbytes} in the prefix, {header.nbytes} in the header"
        )
    left = size - payload_offset(header_len)
    if left != nbytes:
        raise SnapshotMismatchError(
            f"{path}: state length is {nbytes} bytes in the header, the file holds {left} "
            "(truncated or padded)"
        )
    return header, payload_offset(header_len)


def parse_header(raw: bytes, path: Path) -> SnapshotHeader:
    """A SnapshotHeader from header bytes, every field present with its type."""
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise SnapshotMismatchError(f"{path}: snapshot header is not JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise SnapshotMismatchError(f"{path}: snapshot header is not a JSON object")
    for key, kind in _FIELDS.items():
        value = meta.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SnapshotMismatchError(f"{path}: snapshot header lacks a valid {key!r}")
    if meta["format"] != FORMAT:
        raise SnapshotMismatchError(f"{path}: format is {meta['format']!r}, expected {FORMAT!r}")
    tokens = meta["tokens"]
    if not tokens or not all(type(t) is int and 0 <= t < 2**31 for t in tokens):
        raise SnapshotMismatchError(f"{path}: snapshot header's tokens are not token ids")
    if meta["n_tokens"] != len(tokens):
        raise SnapshotMismatchError(
            f"{path}: n_tokens is {meta['n_tokens']}, the token list holds {len(tokens)}"
        )
    if meta["nbytes"] < 1:
        raise SnapshotMismatchError(f"{path}: state length is {meta['nbytes']} bytes")
    ctx = meta["context"]
    missing = [k for k in CONTEXT_FIELDS if k not in ctx]
    if missing:
        raise SnapshotMismatchError(f"{path}: snapshot header's context lacks {missing}")
    if not all(isinstance(p, str) for p in meta["patches"]):
        raise SnapshotMismatchError(f"{path}: snapshot header lacks a valid 'patches'")
    return SnapshotHeader(
        model_fingerprint=meta["model_fingerprint"],
        tokens=tuple(tokens),
        state_flags=meta["state_flags"],
        nbytes=meta["nbytes"],
        sha256=meta["sha256"],
        context={k: ctx[k] for k in CONTEXT_FIELDS},
        llama_cpp_commit=meta["llama_cpp_commit"],
        patches=tuple(meta["patches"]),
        swarmkv_version=meta["swarmkv_version"],
        model_name=meta["model_name"],
        created=meta["created"],
    )


def check_build(header: SnapshotHeader, path: Path | str, commit: str, patches: list[str]) -> None:
    """The state layout is llama.cpp's own: another commit or patch set must not restore it."""
    if header.llama_cpp_commit != commit:
        raise SnapshotMismatchError(
            f"{path}: llama_cpp_commit is {header.llama_cpp_commit[:12]!r} in the file, this "
            f"build runs {commit[:12]!r}"
        )
    if list(header.patches) != list(patches):
        raise SnapshotMismatchError(
            f"{path}: patches are {list(header.patches)} in the file, this build has {patches}"
        )


def check_model(theirs: tuple[str, str], where: Path | str, fingerprint: str, name: str) -> None:
    """SnapshotMismatchError unless the snapshot's (fingerprint, model name) is this model's."""
    if theirs[0] != fingerprint:
        raise SnapshotMismatchError(
            f"{where}: model_fingerprint is {theirs[0][:12]} ({theirs[1] or 'unnamed'}) in the "
            f"snapshot, the model is {fingerprint[:12]} ({name})"
        )


def check_context(
    theirs: Mapping[str, Any], where: Path | str, settings: Mapping[str, Any]
) -> None:
    """SnapshotMismatchError naming the first context setting that differs, with both values."""
    for key in CONTEXT_FIELDS:
        theirs_value, ours = theirs.get(key), settings.get(key)
        if theirs_value != ours:
            raise SnapshotMismatchError(
                f"{where}: context setting {key} is {theirs_value!r} in the snapshot, "
                f"{ours!r} in the context it is restored into"
            )


def write_atomically(path: Path, head: bytes, payload: memoryview) -> Path:
    """Write head + payload under path atomically: a temporary file in the same folder,
    fsync, rename, fsync of the folder. A crash at any point leaves the old file or the new
    one under path, never half of one; a failed write removes its temporary file."""
    path = Path(path)
    if path.is_dir():
        raise SnapshotWriteError(f"cannot save a snapshot to {path}: it is a directory")
    if not path.parent.is_dir():
        raise SnapshotWriteError(f"cannot save a snapshot to {path}: no folder {path.parent}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(head)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SnapshotWriteError(f"cannot save a snapshot to {path}: {exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def fsync_dir(folder: Path) -> None:
    """Make a rename in folder durable (POSIX: the folder's entry must reach the disk)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def payload_digest(data: memoryview | bytes) -> str:
    """sha256 hex digest of the state bytes."""
    return hashlib.sha256(data).hexdigest()


def read_file_header(path: Path) -> SnapshotHeader:
    """The checked header of the `.swkv` file at path (no state read; pure Python)."""
    path = Path(path)
    if path.is_dir():
        raise SnapshotMismatchError(f"{path} is a directory, not a snapshot file")
    try:
        with path.open("rb") as f:
            return read_header(f, path)[0]
    except FileNotFoundError:
        raise SnapshotMismatchError(f"snapshot file not found: {path}") from None
    except OSError as exc:
        raise SnapshotMismatchError(f"cannot read snapshot {path}: {exc.strerror}") from exc
