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

import contextlib
import hashlib
import io
import json
import os
import secrets
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import SnapshotMismatchError, SnapshotWriteError

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
# the state flags a file's state can carry: LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (1) and
# KEEP_SWA_MASKED (4, patch 0001). ON_DEVICE (2) states hold no KV data and never leave their
# context: llama.cpp aborts on one it did not capture itself.
FILE_STATE_FLAGS = 1 | 4
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
    flags = meta["state_flags"]
    if flags < 0 or flags & ~FILE_STATE_FLAGS:
        raise SnapshotMismatchError(
            f"{path}: state_flags is {flags}; a snapshot file holds a host state, whose flags "
            f"are within {FILE_STATE_FLAGS} (ON_DEVICE states never leave their context)"
        )
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


# -- the state bytes (llama.cpp's layout) -----------------------------------------------------
# llama_state_seq_get_data_ext of one sequence, as the pinned llama.cpp writes it (a KV-cache
# memory: llama_kv_cache::state_write, once per cache; a model with sliding-window attention
# has two caches, the full one and the window's):
#
#   u32 magic 0xaf143cd8, i32 source seq id, then per cache:
#     u32 n_stream, then per stream: u32 cell_count and, when cell_count > 0,
#       cell_count x (i32 pos, u32 n_seq_id = 1, [12-byte cell ext: M-RoPE / PLE models],
#                     i32 seq id),
#       u32 v_trans, u32 n_layer,
#       n_layer x (i32 K type, u64 K row size, cell_count rows),
#       n_layer x (i32 V type, u64 V row size, cell_count rows)            if not v_trans,
#       n_layer x (i32 V type, u32 V element size, u32 n_embd_v, n_embd_v x cell_count
#                  elements)                                             if v_trans
#       (no V at all in a cache without V: MLA models).
#
# llama.cpp trusts the positions it reads: a negative, repeated or out-of-range position
# becomes a cell that its own bookkeeping later trips over, and bytes it does not consume
# are still copied into cells before the caller can refuse them. So check_state walks the
# whole layout before a byte reaches llama.cpp; llama.cpp still checks types and row sizes
# against the context itself.
STATE_MAGIC = 0xAF143CD8
MAX_SEQ = 256  # LLAMA_MAX_SEQ (src/llama-cparams.h)
GGML_TYPE_COUNT = 43  # ggml.h of the pinned tree
_CELL_EXT = 12  # llama_kv_cell_ext: x, y, tok
_MAX_CACHES = 2  # llama_kv_cache_iswa: the full cache, then the window's


class _BadState(Exception):
    """One reason a state does not parse under one layout variant."""


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.off = 0

    def left(self) -> int:
        return len(self.data) - self.off

    def take(self, fmt: struct.Struct, what: str) -> tuple[int, ...]:
        if fmt.size > self.left():
            raise _BadState(f"it ends inside {what} at byte {self.off}")
        values = fmt.unpack_from(self.data, self.off)
        self.off += fmt.size
        return values

    def skip(self, nbytes: int, what: str) -> memoryview:
        if nbytes > self.left():
            raise _BadState(
                f"{what} needs {nbytes} bytes at byte {self.off}, {self.left()} are left"
            )
        chunk = self.data[self.off : self.off + nbytes]
        self.off += nbytes
        return chunk


_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<Ii")
_TYPE_ROW = struct.Struct("<iQ")
_TYPE_EL_N = struct.Struct("<iII")
_U32X2 = struct.Struct("<II")


def check_state(
    data: memoryview | bytes, *, n_tokens: int, n_stream: int, n_layer: int, where: Path | str
) -> None:
    """SnapshotMismatchError unless data is a sequence state of n_tokens positions that a
    context with n_stream KV streams and n_layer layers can take (the layout above).

    Checked: the magic, the source seq id, every cache's stream count, that exactly one stream
    per cache holds cells, each cell one sequence, the positions (distinct, the last
    cell_count positions of the prefix: all of them, or the window's tail), the V layout
    flag, the layer count, every type id and that each size lies inside the bytes, and that
    the layout ends exactly where the bytes do. Pure Python; reads only the metadata.
    """
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if len(view) < _HEAD.size or _HEAD.unpack_from(view)[0] != STATE_MAGIC:
        raise SnapshotMismatchError(f"{where}: the state does not start with llama.cpp's magic")
    src = _HEAD.unpack_from(view)[1]
    if not 0 <= src < MAX_SEQ:
        raise SnapshotMismatchError(f"{where}: the state's source seq id is {src}")
    reasons: list[str] = []
    for ext, has_v in ((False, True), (True, True), (False, False), (True, False)):
        try:
            _walk(view, n_tokens, n_stream, n_layer, ext, has_v)
            return
        except _BadState as exc:
            reasons.append(str(exc))
    raise SnapshotMismatchError(
        f"{where}: the state is not a sequence state of {n_tokens} tokens for this context "
        f"({n_stream} KV stream(s), {n_layer} layers): {reasons[0]}"
    )


def _walk(
    view: memoryview, n_tokens: int, n_stream: int, n_layer_max: int, ext: bool, has_v: bool
) -> None:
    r = _Reader(view)
    r.off = _HEAD.size
    caches = 0
    while r.left():
        if caches == _MAX_CACHES:
            raise _BadState(f"{r.left()} bytes follow its {caches} KV caches")
        (streams,) = r.take(_U32, "a stream count")
        if streams != n_stream:
            raise _BadState(f"a cache has {streams} KV streams, the context {n_stream}")
        filled = 0
        for s in range(streams):
            (cells,) = r.take(_U32, f"stream {s}'s cell count")
            if cells == 0:
                continue
            filled += 1
            if cells > n_tokens:
                raise _BadState(
                    f"the state holds {cells} positions but the snapshot names {n_tokens} tokens"
                )
            _check_cells(r, cells, n_tokens, ext)
            _skip_layers(r, cells, n_layer_max, has_v)
        if filled != 1:
            raise _BadState(f"{filled} streams of a cache hold cells, a sequence lives in one")
        caches += 1
    if caches == 0:
        raise _BadState("it holds no KV cache")


def _check_cells(r: _Reader, cells: int, n_tokens: int, ext: bool) -> None:
    """The cell metadata: one sequence per cell, positions exactly the last `cells` ones."""
    import numpy as np  # here, not at the top: `import swarmkv` does not load numpy

    width = 3 + (_CELL_EXT // 4 if ext else 0)  # int32 fields per cell
    meta = np.frombuffer(r.skip(cells * width * 4, "the cell metadata"), dtype="<i4")
    meta = meta.reshape(cells, width)
    if (meta[:, 1] != 1).any():
        raise _BadState("a cell belongs to more or fewer than one sequence")
    pos = meta[:, 0].astype(np.int64)
    first = n_tokens - cells
    if pos.min() < first or pos.max() >= n_tokens:
        raise _BadState(
            f"cell positions span [{pos.min()}, {pos.max()}], a sequence of {n_tokens} tokens "
            f"holding {cells} cells has [{first}, {n_tokens - 1}]"
        )
    if not (np.bincount(pos - first, minlength=cells) == 1).all():
        raise _BadState("a cell position repeats")


def _skip_layers(r: _Reader, cells: int, n_layer_max: int, has_v: bool) -> None:
    """The K and V data of one stream: the flag, the layer count, each layer's type and size."""
    v_trans, n_layer = r.take(_U32X2, "the V layout flag and layer count")
    if v_trans > 1:
        raise _BadState(f"the V layout flag is {v_trans}")
    if not 1 <= n_layer <= n_layer_max:
        raise _BadState(f"a cache has {n_layer} layers, the model {n_layer_max}")
    for il in range(n_layer):
        k_type, k_row = r.take(_TYPE_ROW, f"layer {il}'s K type and row size")
        _check_type(k_type, k_row, f"layer {il}'s K")
        r.skip(cells * k_row, f"layer {il}'s K rows")
    if not has_v:
        return
    for il in range(n_layer):
        if not v_trans:
            v_type, v_row = r.take(_TYPE_ROW, f"layer {il}'s V type and row size")
            _check_type(v_type, v_row, f"layer {il}'s V")
            r.skip(cells * v_row, f"layer {il}'s V rows")
        else:
            v_type, v_el, n_embd = r.take(_TYPE_EL_N, f"layer {il}'s V type and sizes")
            _check_type(v_type, v_el * n_embd, f"layer {il}'s V")
            r.skip(cells * v_el * n_embd, f"layer {il}'s V elements")


def _check_type(type_id: int, row: int, what: str) -> None:
    if not 0 <= type_id < GGML_TYPE_COUNT:
        raise _BadState(f"{what} type id is {type_id}")
    if row < 1:
        raise _BadState(f"{what} row size is {row}")


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


TEMP_SUFFIX = ".tmp"
_TEMP_TRIES = 100


def temp_prefix(path: Path, pid: int | None = None) -> str:
    """How the names of the temporary files that saves to path by process pid (this one by
    default) write first begin: `.NAME.PID.`; a random part and TEMP_SUFFIX follow."""
    return f".{path.name}.{os.getpid() if pid is None else pid}."


def temp_files(path: Path, pid: int | None = None) -> list[Path]:
    """The temporary files (of any kind) beside path that saves by process pid (this one by
    default) made: those in progress, and those a SIGKILL left behind."""
    prefix = temp_prefix(path, pid)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return sorted(
        path.parent / n for n in names if n.startswith(prefix) and n.endswith(TEMP_SUFFIX)
    )


def check_save_path(path: Path) -> None:
    """SnapshotWriteError naming path unless a snapshot can be saved there: path is not a
    directory, its folder exists, and a new file can be created in that folder (tried with a
    temporary file, removed at once: permissions, ACLs, read-only mounts all answer). For
    callers that do long work before they save (`swarmkv snapshot create`)."""
    path = Path(path)
    _check_target(path)
    fd, tmp = _create_temp(path)
    os.close(fd)
    _remove(tmp)


def _check_target(path: Path) -> None:
    if path.is_dir():
        raise SnapshotWriteError(f"cannot save a snapshot to {path}: it is a directory")
    folder = path.parent
    if not folder.is_dir():
        why = f"{folder} is not a folder" if folder.exists() else f"no folder {folder}"
        raise SnapshotWriteError(f"cannot save a snapshot to {path}: {why}")


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temporary file beside path, open for writing: its name is this save's
    alone (O_EXCL, a random part), so concurrent saves from threads or processes never share
    one; a name already taken (a leftover of a killed save) is skipped. Mode 0666 less the
    umask, like any new file (tempfile.mkstemp would make the saved file 0600)."""
    prefix = temp_prefix(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for _ in range(_TEMP_TRIES):
        tmp = path.with_name(f"{prefix}{secrets.token_hex(6)}{TEMP_SUFFIX}")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise SnapshotWriteError(
                f"cannot save a snapshot to {path}: cannot create a file in {path.parent}: "
                f"{exc.strerror or exc}"
            ) from exc
    raise SnapshotWriteError(
        f"cannot save a snapshot to {path}: {_TEMP_TRIES} temporary names beside it are taken"
    )


def write_atomically(path: Path, head: bytes, payload: memoryview) -> Path:
    """Write head + payload under path atomically: a temporary file of this save's own in the
    same folder (`.NAME.PID.RANDOM.tmp`, see _create_temp), fsync, rename, fsync of the
    folder. A crash at any point leaves the old file or the new one under path, never half of
    one, and saves racing from several threads or processes each rename a whole file of their
    own (the last rename wins). A failed write (a directory in the way, a full disk, a
    file-size limit, an exception) removes its temporary file and raises SnapshotWriteError;
    only a process killed outright (SIGKILL, power loss) mid-write can leave a
    `.NAME.PID.RANDOM.tmp` beside path, which no load reads and a later save ignores."""
    path = Path(path)
    _check_target(path)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as exc:
        _remove(tmp)
        raise SnapshotWriteError(f"cannot save a snapshot to {path}: {exc}") from exc
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(path.parent)
    return path


def _remove(tmp: Path) -> None:
    """Remove a failed save's (or check_save_path's) temporary file; never raise over the
    error being reported."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def check_state_start(f: IO[bytes], offset: int, path: Path | str) -> None:
    """SnapshotMismatchError unless the state at offset starts with llama.cpp's magic: read
    before any memory is allocated or mapped for the state (a zero-filled or sparse file
    claiming gigabytes is refused here, not after reading it)."""
    f.seek(offset)
    start = f.read(4)
    if len(start) < 4 or _U32.unpack(start)[0] != STATE_MAGIC:
        raise SnapshotMismatchError(
            f"{path}: the state does not start with llama.cpp's magic (corrupt)"
        )


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


def file_digest(f: io.BufferedIOBase, offset: int, nbytes: int, chunk: int = 1 << 20) -> str | None:
    """sha256 hex digest of the nbytes at offset of an open file, read a chunk at a time
    (memory: one chunk, whatever nbytes is); None if the file ends first."""
    digest = hashlib.sha256()
    view = memoryview(bytearray(max(1, min(chunk, nbytes))))
    f.seek(offset)
    left = nbytes
    while left:
        got = f.readinto(view[: min(len(view), left)])
        if not got:
            return None
        digest.update(view[:got])
        left -= got
    return digest.hexdigest()


def open_snapshot_file(path: Path) -> io.BufferedReader:
    """The `.swkv` file at path, open for reading; SnapshotMismatchError naming what is wrong."""
    if path.is_dir():
        raise SnapshotMismatchError(f"{path} is a directory, not a snapshot file")
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise SnapshotMismatchError(f"snapshot file not found: {path}") from None
    except OSError as exc:
        raise SnapshotMismatchError(f"cannot read snapshot {path}: {exc.strerror}") from exc


def read_file_header(path: Path) -> SnapshotHeader:
    """The checked header of the `.swkv` file at path (no state read; pure Python)."""
    path = Path(path)
    with open_snapshot_file(path) as f:
        return read_header(f, path)[0]
