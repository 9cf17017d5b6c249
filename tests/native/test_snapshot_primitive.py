"""The snapshot primitive on the tiny llama: capture a prefix's KV state, restore it elsewhere,
and get the logits (and greedy continuation) of having decoded the prefix there."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import swarmkv
from swarmkv import (
    Context,
    HostBufferPool,
    KVSnapshot,
    Model,
    Sampler,
    SnapshotMismatchError,
    SnapshotWriteError,
)

Prefill = Callable[..., int]

N_PREFIX = 100
N_SUFFIX = 6
N_GREEDY = 16
NMSE_MAX = 1e-5
# Every context here has two KV streams (n_seq_max=2, not unified): a sequence's state bytes
# record the stream count and restore only into a context with the same one.
CTX: dict[str, Any] = {"n_ctx": 512, "n_batch": 64, "n_seq_max": 2, "n_threads": 1}


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    """Normalised mean squared error of a against the reference b."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.sum((a64 - b64) ** 2) / np.sum(b64**2))


def continue_seq(
    ctx: Context, seq_id: int, suffix: list[int], prefill: Prefill
) -> tuple[np.ndarray, list[int]]:
    """Decode suffix on seq_id, then 16 greedy tokens; (logits after the suffix, tokens)."""
    row = prefill(ctx, suffix, seq_id=seq_id)
    logits = ctx.logits(row).copy()
    generated: list[int] = []
    with Sampler() as sampler:
        for _ in range(N_GREEDY):
            token = sampler.sample(ctx, row)
            generated.append(token)
            row = prefill(ctx, [token], seq_id=seq_id)
    return logits, generated


@pytest.fixture
def pool() -> Iterator[HostBufferPool]:
    with HostBufferPool() as p:
        yield p


@pytest.fixture
def ctx2(tiny_model: Model) -> Iterator[Context]:
    with Context(tiny_model, **CTX) as ctx:
        yield ctx


@pytest.fixture
def prefix(prompt_tokens: list[int]) -> tuple[int, ...]:
    return tuple(prompt_tokens[:N_PREFIX])


@pytest.fixture
def suffix(prompt_tokens: list[int]) -> list[int]:
    return prompt_tokens[N_PREFIX : N_PREFIX + N_SUFFIX]


@pytest.fixture
def snap(
    ctx2: Context, pool: HostBufferPool, prefix: tuple[int, ...], prefill: Prefill
) -> KVSnapshot:
    """The prefix decoded on seq 0 of ctx2 (in 64-token chunks) and captured."""
    prefill(ctx2, prefix, seq_id=0, logits_last=False)
    snapshot = swarmkv.capture(ctx2, 0, pool, prefix)
    assert snapshot.n_tokens == N_PREFIX
    assert snapshot.nbytes == ctx2.state_seq_size(0) > 0
    assert snapshot.model_fingerprint == ctx2.model.fingerprint
    assert snapshot.capture_ms is not None and snapshot.capture_ms >= 0
    return snapshot


def test_restore_into_another_sequence_and_a_fresh_context(
    ctx2: Context,
    snap: KVSnapshot,
    tiny_model: Model,
    suffix: list[int],
    prefill: Prefill,
) -> None:
    swarmkv.restore(ctx2, 1, snap)
    assert (ctx2.seq_pos_min(1), ctx2.seq_pos_max(1)) == (0, N_PREFIX - 1)

    ref_logits, ref_tokens = continue_seq(ctx2, 0, suffix, prefill)
    seq1_logits, seq1_tokens = continue_seq(ctx2, 1, suffix, prefill)
    with Context(tiny_model, **CTX) as fresh:
        ms = swarmkv.restore(fresh, 0, snap)
        assert ms >= 0
        fresh_logits, fresh_tokens = continue_seq(fresh, 0, suffix, prefill)
    with Context(tiny_model, **CTX) as empty:  # control: no prefix at all
        bare_logits, _ = continue_seq(empty, 0, suffix, prefill)

    assert nmse(seq1_logits, ref_logits) <= NMSE_MAX
    assert nmse(fresh_logits, ref_logits) <= NMSE_MAX
    assert seq1_tokens == ref_tokens
    assert fresh_tokens == ref_tokens
    assert nmse(bare_logits, ref_logits) > 1e-2  # the restored prefix is what made them equal


def test_restore_replaces_what_the_sequence_held(
    ctx2: Context, snap: KVSnapshot, suffix: list[int], prefill: Prefill
) -> None:
    prefill(ctx2, [1, 500, 501, 502, 503, 504, 505, 506], seq_id=1)
    swarmkv.restore(ctx2, 1, snap)
    assert ctx2.seq_pos_max(1) == N_PREFIX - 1
    ref_logits, _ = continue_seq(ctx2, 0, suffix, prefill)
    seq1_logits, _ = continue_seq(ctx2, 1, suffix, prefill)
    assert nmse(seq1_logits, ref_logits) <= NMSE_MAX


def test_fork_copies_the_bytes(snap: KVSnapshot, pool: HostBufferPool) -> None:
    forked = snap.fork(pool)
    assert forked.buffer is not snap.buffer
    assert bytes(forked.data) == bytes(snap.data)
    assert (forked.tokens, forked.model_fingerprint) == (snap.tokens, snap.model_fingerprint)
    forked.data[0] ^= 0xFF
    assert bytes(forked.data) != bytes(snap.data)
    forked.release()
    assert pool.stats().n_in_use == 1


def test_save_load_restore_gives_identical_logits(
    ctx2: Context,
    snap: KVSnapshot,
    pool: HostBufferPool,
    tiny_model: Model,
    suffix: list[int],
    prefill: Prefill,
    tmp_path: Path,
) -> None:
    path = snap.save(tmp_path / "prefix.swkv")
    assert not list(tmp_path.glob(".*.tmp"))  # the temp file was renamed
    loaded = KVSnapshot.load(path, pool)
    assert loaded.tokens == snap.tokens
    assert loaded.model_fingerprint == snap.model_fingerprint
    assert loaded.flags == snap.flags
    assert bytes(loaded.data) == bytes(snap.data)

    ref_logits, ref_tokens = continue_seq(ctx2, 0, suffix, prefill)
    with Context(tiny_model, **CTX) as fresh:
        swarmkv.restore(fresh, 0, loaded)
        logits, tokens = continue_seq(fresh, 0, suffix, prefill)
    assert nmse(logits, ref_logits) <= NMSE_MAX
    assert tokens == ref_tokens


def _split(path: Path) -> tuple[bytes, bytes, bytes]:
    """(fixed prefix, header JSON + its digest, state) of a version-2 file."""
    data = path.read_bytes()
    (header_len,) = struct.unpack("<I", data[8:12])
    end = 20 + header_len + 32
    return data[:20], data[20:end], data[end:]


def _rewrite(path: Path, meta: dict[str, Any], payload: bytes, nbytes: int | None = None) -> None:
    """Write a file with header meta, a correct header digest, and payload."""
    raw = json.dumps(meta).encode()
    size = len(payload) if nbytes is None else nbytes
    prefix = b"SWKV" + struct.pack("<IIQ", 2, len(raw), size)
    path.write_bytes(prefix + raw + hashlib.sha256(raw).digest() + payload)


def test_corrupt_payload_is_refused(snap: KVSnapshot, pool: HostBufferPool, tmp_path: Path) -> None:
    path = snap.save(tmp_path / "prefix.swkv")
    head, header, payload = _split(path)
    corrupt = bytearray(payload)
    corrupt[len(corrupt) // 2] ^= 0x01
    path.write_bytes(head + header + bytes(corrupt))
    in_use = pool.stats().n_in_use
    with pytest.raises(SnapshotMismatchError, match="state checksum mismatch"):
        KVSnapshot.load(path, pool)
    assert pool.stats().n_in_use == in_use  # the buffer went back

    path.write_bytes(head + header + payload[:-10])
    with pytest.raises(SnapshotMismatchError, match="truncated"):
        KVSnapshot.load(path, pool)


@pytest.mark.parametrize("content", [b"GGUF\x03\x00\x00\x00" + bytes(64), b"SWK", b""])
def test_wrong_magic_is_refused(pool: HostBufferPool, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "not-a-snapshot.swkv"
    path.write_bytes(content)
    with pytest.raises(SnapshotMismatchError, match="not a SwarmKV snapshot"):
        KVSnapshot.load(path, pool)


def test_unknown_version_is_refused(snap: KVSnapshot, pool: HostBufferPool, tmp_path: Path) -> None:
    path = snap.save(tmp_path / "prefix.swkv")
    head, header, payload = _split(path)
    path.write_bytes(head[:4] + struct.pack("<I", 99) + head[8:] + header + payload)
    with pytest.raises(SnapshotMismatchError, match="version is 99 in the file"):
        KVSnapshot.load(path, pool)


@pytest.mark.parametrize("damage", ["truncated header", "header not UTF-8", "missing key"])
def test_corrupt_header_is_refused(
    snap: KVSnapshot, pool: HostBufferPool, tmp_path: Path, damage: str
) -> None:
    """A damaged header is as corrupt as a damaged payload: SnapshotMismatchError, not a
    JSONDecodeError, UnicodeDecodeError or KeyError from the parsing."""
    path = snap.save(tmp_path / "prefix.swkv")
    head, header, payload = _split(path)
    if damage == "truncated header":
        path.write_bytes(head + header[: len(header) // 2])
    elif damage == "header not UTF-8":
        path.write_bytes(head + b"\xff" + header[1:] + payload)
    else:  # a consistent file (header digest recomputed) whose header lacks a field
        meta = json.loads(header[:-32])
        del meta["sha256"]
        _rewrite(path, meta, payload)
    with pytest.raises(SnapshotMismatchError):
        KVSnapshot.load(path, pool)


def test_capture_checks_the_token_count(
    ctx2: Context, pool: HostBufferPool, prefix: tuple[int, ...], prefill: Prefill
) -> None:
    prefill(ctx2, prefix[:10], seq_id=0, logits_last=False)
    with pytest.raises(SnapshotMismatchError, match="holds 10 positions"):
        swarmkv.capture(ctx2, 0, pool, prefix[:9])
    assert pool.stats().n_in_use == 0


def test_restore_refuses_a_snapshot_longer_than_the_context(
    snap: KVSnapshot, tiny_model: Model
) -> None:
    too_long = KVSnapshot(snap.buffer, tuple(range(300)), snap.model_fingerprint)
    with Context(tiny_model, n_ctx=256, n_batch=64, n_threads=1) as small:
        with pytest.raises(SnapshotMismatchError, match=r"exceeds the 256 cells .*n_ctx=256"):
            swarmkv.restore(small, 0, too_long)
        assert small.seq_pos_max(0) is None


def test_restore_checks_one_sequences_cells_not_the_whole_context(
    snap: KVSnapshot, tiny_model: Model
) -> None:
    # 2 streams of 256 cells: a 300-token snapshot fits n_ctx=512 but not one sequence
    too_long = KVSnapshot(snap.buffer, tuple(range(300)), snap.model_fingerprint)
    with Context(tiny_model, n_ctx=512, n_batch=64, n_seq_max=2, n_threads=1) as ctx:
        assert ctx.n_ctx_seq == 256
        with pytest.raises(SnapshotMismatchError, match=r"exceeds the 256 cells"):
            swarmkv.restore(ctx, 1, too_long)


@pytest.mark.parametrize(
    "config",
    [{"n_seq_max": 1}, {"n_seq_max": 3}, {"n_seq_max": 2, "kv_unified": True}],
    ids=["1 stream", "3 streams", "unified"],
)
def test_restore_into_a_context_with_another_kv_stream_count(
    snap: KVSnapshot, tiny_model: Model, config: dict[str, object]
) -> None:
    with Context(tiny_model, n_ctx=768, n_batch=64, n_threads=1, **config) as other:
        # refused in Python, before llama.cpp sees the bytes (it would reject them too)
        with pytest.raises(SnapshotMismatchError, match="n_stream is 2 in the snapshot"):
            swarmkv.restore(other, 0, snap)
        assert other.seq_pos_max(0) is None


def test_restore_detects_a_token_count_that_disagrees_with_the_bytes(
    ctx2: Context, snap: KVSnapshot
) -> None:
    lying = KVSnapshot(snap.buffer, snap.tokens[:-1], snap.model_fingerprint)
    with pytest.raises(SnapshotMismatchError, match="holds 100 positions"):
        swarmkv.restore(ctx2, 1, lying)


def _with_header(path: Path, **changes: object) -> None:
    """Change header fields, keeping the file self-consistent (digest, state length)."""
    _, header, payload = _split(path)
    meta = {**json.loads(header[:-32]), **changes}
    nbytes = meta["nbytes"]
    assert isinstance(nbytes, int)
    _rewrite(path, meta, payload, nbytes)


def test_huge_size_claim_is_refused_before_allocating(
    snap: KVSnapshot, pool: HostBufferPool, tmp_path: Path
) -> None:
    path = snap.save(tmp_path / "prefix.swkv")
    _with_header(path, nbytes=8 << 30)
    before = pool.stats()
    with pytest.raises(SnapshotMismatchError, match=r"8589934592 bytes in the header.*holds"):
        KVSnapshot.load(path, pool)
    after = pool.stats()
    assert (after.n_buffers, after.bytes_allocated) == (before.n_buffers, before.bytes_allocated)


def test_snapshot_from_another_llama_cpp_commit_is_refused(
    snap: KVSnapshot, pool: HostBufferPool, tmp_path: Path
) -> None:
    path = snap.save(tmp_path / "prefix.swkv")
    assert json.loads(_split(path)[1][:-32])["llama_cpp_commit"] == swarmkv.LLAMA_CPP_COMMIT
    _with_header(path, llama_cpp_commit="f" * 40)
    with pytest.raises(SnapshotMismatchError, match=r"'ffffffffffff' in the file, this build"):
        KVSnapshot.load(path, pool)


def test_failed_save_leaves_no_temporary_file(snap: KVSnapshot, tmp_path: Path) -> None:
    target = tmp_path / "a-directory"
    target.mkdir()
    with pytest.raises(SnapshotWriteError, match="is a directory"):
        snap.save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-directory"]
