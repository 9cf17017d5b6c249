"""Faults around snapshot files and restores, one test each: a save that fails leaves no
temporary file, a huge size claim allocates nothing, a restore refused before the native call
leaves the target sequence as it was, and one that llama.cpp rejects leaves it empty and
every other sequence untouched.

The cases that would abort the process if they regressed (llama.cpp GGML_ASSERTs) run in a
child process, so they fail as a test and not as a dead test run.
"""

from __future__ import annotations

import hashlib
import json
import struct
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import swarmkv
import swarmkv.kv.snapshot as snapshot_module
from swarmkv import (
    Context,
    HostBufferPool,
    KVSnapshot,
    Model,
    PoolError,
    SnapshotMismatchError,
    SnapshotWriteError,
    SwarmKVError,
)

from support.memory import rss_bytes
from support.proc import last_json_line, python_cmd, run

Prefill = Callable[..., int]

# batch-invariant: logits do not depend on where in the cache a sequence's cells are, so a
# sequence's next-token logits before and after an event compare bit for bit
CTX: dict[str, Any] = {
    "n_ctx": 512,
    "n_batch": 64,
    "n_seq_max": 2,
    "n_threads": 1,
    "batch_invariant": True,
}
N_PREFIX = 64
N_TARGET = 10  # what the target sequence holds before a restore
TARGET, OTHER = 1, 0
GIB8 = 8 << 30


# -- helpers --------------------------------------------------------------------------------------
def state_bytes(ctx: Context, seq: int) -> bytes:
    buf = bytearray(ctx.state_seq_size(seq))
    ctx.state_seq_get(seq, memoryview(buf))
    return bytes(buf)


def next_logits(ctx: Context, seq: int, token: int, prefill: Prefill) -> bytes:
    """seq's logits for one more token (bit pattern); the token's cell is removed again."""
    n = ctx.seq_len(seq)
    row = prefill(ctx, [token], seq_id=seq)
    logits = np.ascontiguousarray(ctx.logits(row)).tobytes()
    ctx.seq_rm(seq, n, None)
    return logits


class Seq:
    """What a sequence holds, as proof that nothing changed it: positions, state bytes,
    next-token logits."""

    def __init__(self, ctx: Context, seq: int, token: int, prefill: Prefill) -> None:
        self.ctx, self.seq, self.token, self.prefill = ctx, seq, token, prefill
        self.facts = self._facts()

    def _facts(self) -> tuple[Any, ...]:
        ctx, seq = self.ctx, self.seq
        return (
            ctx.seq_pos_min(seq),
            ctx.seq_pos_max(seq),
            state_bytes(ctx, seq),
            next_logits(ctx, seq, self.token, self.prefill),
        )

    def assert_unchanged(self) -> None:
        now = self._facts()
        assert now[:2] == self.facts[:2], f"seq {self.seq} positions {self.facts[:2]} -> {now[:2]}"
        assert now[2] == self.facts[2], f"seq {self.seq}'s state bytes changed"
        assert now[3] == self.facts[3], f"seq {self.seq}'s next-token logits changed"


def split(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (header_len,) = struct.unpack_from("<I", data, 8)
    return json.loads(data[20 : 20 + header_len]), data[20 + header_len + 32 :]


def write_file(
    path: Path, meta: dict[str, Any], state: bytes, *, nbytes: int | None = None
) -> None:
    """A self-consistent file (header digest, lengths; the state digest unless nbytes)."""
    meta = dict(meta)
    if nbytes is None:
        meta["nbytes"], meta["sha256"] = len(state), hashlib.sha256(state).hexdigest()
    else:
        meta["nbytes"] = nbytes
    raw = json.dumps(meta).encode()
    head = b"SWKV" + struct.pack("<IIQ", 2, len(raw), meta["nbytes"])
    path.write_bytes(head + raw + hashlib.sha256(raw).digest() + state)


def run_child(script: str, *args: str, cwd: Path) -> dict[str, Any]:
    """Run a Python script in a child process; its last stdout line, as JSON. A crash (an
    abort in llama.cpp) fails the test with the signal and the child's stderr."""
    return dict(last_json_line(run(python_cmd("-c", textwrap.dedent(script), *args), cwd=cwd)))


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture
def pool() -> Iterator[HostBufferPool]:
    with HostBufferPool() as p:
        yield p


@pytest.fixture
def ctx(tiny_model: Model) -> Iterator[Context]:
    with Context(tiny_model, **CTX) as c:
        yield c


@pytest.fixture
def prefix(prompt_tokens: list[int]) -> tuple[int, ...]:
    return tuple(prompt_tokens[:N_PREFIX])


@pytest.fixture
def snap(
    ctx: Context, pool: HostBufferPool, prefix: tuple[int, ...], prefill: Prefill
) -> KVSnapshot:
    """The prefix captured from seq 0 of a context like ctx (then freed)."""
    with Context(ctx.model, **CTX) as src:
        prefill(src, prefix, seq_id=0, logits_last=False)
        return swarmkv.capture(src, 0, pool, prefix)


@pytest.fixture
def filled(ctx: Context, prompt_tokens: list[int], prefill: Prefill) -> tuple[Seq, Seq]:
    """ctx with another sequence in seq 0 and a short one in seq 1, both recorded."""
    prefill(ctx, prompt_tokens[150:190], seq_id=OTHER, logits_last=False)
    prefill(ctx, prompt_tokens[200 : 200 + N_TARGET], seq_id=TARGET, logits_last=False)
    token = prompt_tokens[N_PREFIX]
    return Seq(ctx, OTHER, token, prefill), Seq(ctx, TARGET, token, prefill)


# -- saves ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("blocker", ["directory", "symlink to a directory"])
def test_failed_save_raises_and_leaves_no_temporary_file(
    snap: KVSnapshot, tmp_path: Path, blocker: str
) -> None:
    target = tmp_path / "prefix.swkv"
    if blocker == "directory":
        target.mkdir()
    else:
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SnapshotWriteError, match=str(target)):
        snap.save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


_FSIZE_CHILD = """
    import json, os, resource, sys
    import swarmkv
    from swarmkv import Context, HostBufferPool, KVSnapshot, Model, SnapshotWriteError
    from swarmkv.kv.file import encode
    from support.decoding import prefill

    model_path, folder = sys.argv[1], sys.argv[2]
    with Model(model_path) as model, Context(model, n_ctx=512, n_batch=64, n_threads=1) as ctx:
        pool = HostBufferPool()
        tokens = model.tokenize("a document to snapshot, " * 40)[:150]
        prefill(ctx, tokens, logits_last=False)
        snap = swarmkv.capture(ctx, 0, pool, tuple(tokens))
        old = snap.save(os.path.join(folder, "prefix.swkv")).read_bytes()
        head = len(encode(snap.header()))
        size = head + snap.nbytes
        results = []
        # Python ignores SIGXFSZ: a write past the limit fails with EFBIG instead
        for limit in (0, 1, 19, 20, head - 1, head, head + 1, size // 2, size - 1, size):
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            try:
                snap.save(os.path.join(folder, "prefix.swkv"))
                outcome = "saved"
            except SnapshotWriteError as exc:
                outcome = str(exc)
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            on_disk = open(os.path.join(folder, "prefix.swkv"), "rb").read()
            results.append({
                "limit": limit,
                "outcome": outcome,
                "files": sorted(os.listdir(folder)),
                "old_file_intact": on_disk == old,
                "loads": bytes(KVSnapshot.load(os.path.join(folder, "prefix.swkv"), pool).data)
                == bytes(snap.data),
            })
        print(json.dumps({"size": size, "results": results}))
"""


def test_save_past_a_file_size_limit_raises_and_leaves_no_temporary_file(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    out = run_child(_FSIZE_CHILD, str(tiny_model_path), str(folder), cwd=tmp_path)
    *too_small, enough = out["results"]
    for r in too_small:
        assert (
            r["outcome"].startswith("cannot save a snapshot to ") and "too large" in r["outcome"]
        ), r
        assert r["files"] == ["prefix.swkv"], r  # no temporary file left
        assert r["old_file_intact"] and r["loads"], r
    assert enough["limit"] == out["size"] and enough["outcome"] == "saved", enough
    assert enough["files"] == ["prefix.swkv"] and enough["loads"], enough


# -- loads ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["claim only", "sparse file of 8 GiB"])
def test_huge_size_claim_allocates_nothing(
    snap: KVSnapshot, pool: HostBufferPool, tmp_path: Path, how: str
) -> None:
    path = snap.save(tmp_path / "prefix.swkv")
    meta, state = split(path)
    if how == "claim only":  # the header says 8 GiB, the file holds the real state
        write_file(path, meta, state, nbytes=GIB8)
        match = r"8589934592 bytes in the header, the file holds"
    else:  # the file really is that long: a hole of zeros after a consistent header
        write_file(path, meta, b"", nbytes=GIB8)
        with path.open("r+b") as f:
            f.truncate(path.stat().st_size + GIB8)
        assert path.stat().st_blocks * 512 < 1 << 20  # sparse: nothing on disk
        match = "does not start with llama.cpp's magic"
        assert swarmkv.read_snapshot_header(path).nbytes == GIB8  # a consistent header
    before, rss0, t0 = pool.stats(), rss_bytes(settle=False), time.perf_counter()
    with pytest.raises(SnapshotMismatchError, match=match):
        KVSnapshot.load(path, pool)
    with pytest.raises(SnapshotMismatchError, match=match):
        KVSnapshot.open_shared(path)
    assert pool.stats() == before  # not a byte allocated, no buffer taken
    assert rss_bytes(settle=False) - rss0 < 32 << 20, "the refused file was read into memory"
    assert time.perf_counter() - t0 < 5, "the refused file was read"


def test_a_state_larger_than_available_memory_is_refused_before_allocating(
    snap: KVSnapshot, pool: HostBufferPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = snap.save(tmp_path / "prefix.swkv")
    monkeypatch.setattr(snapshot_module, "mem_available_bytes", lambda: snap.nbytes - 1)
    before = pool.stats()
    with pytest.raises(PoolError, match=rf"state of {snap.nbytes} bytes exceeds the"):
        KVSnapshot.load(path, pool)
    assert pool.stats() == before
    monkeypatch.undo()
    assert bytes(KVSnapshot.load(path, pool).data) == bytes(snap.data)


def test_a_file_claiming_an_on_device_state_is_refused(
    snap: KVSnapshot, pool: HostBufferPool, tmp_path: Path
) -> None:
    """ON_DEVICE states hold no KV data; llama.cpp aborts (GGML_ASSERT) restoring one whose
    source sequence it has no device copy of. A file never holds one: save refuses them."""
    path = snap.save(tmp_path / "prefix.swkv")
    meta, state = split(path)
    for flags in (2, 3, 6, 8, -1):
        write_file(path, {**meta, "state_flags": flags}, state)
        with pytest.raises(SnapshotMismatchError, match=rf"state_flags is {flags}"):
            KVSnapshot.load(path, pool)
        with pytest.raises(SnapshotMismatchError, match=rf"state_flags is {flags}"):
            KVSnapshot.open_shared(path)
    assert pool.stats().n_in_use == 1  # snap's own buffer


_ON_DEVICE_CHILD = """
    import json, sys
    import swarmkv
    from swarmkv import Batch, Context, HostBufferPool, KVSnapshot, Model, SwarmKVError
    from swarmkv._native import lib

    with Model(sys.argv[1]) as model, Context(model, n_ctx=512, n_seq_max=2, n_threads=1) as ctx:
        pool = HostBufferPool()
        tokens = model.tokenize("a document to snapshot, " * 10)[:40]
        with Batch(64) as batch:
            batch.add_sequence(tokens, 0, 0, False)
            ctx.decode(batch)
        host = swarmkv.capture(ctx, 0, pool, tuple(tokens))
        # host bytes that claim ON_DEVICE: no device copy of their source sequence exists
        forged = KVSnapshot(host.buffer, host.tokens, host.model_fingerprint,
                            host.flags | int(lib.LLAMA_STATE_SEQ_FLAGS_ON_DEVICE),
                            context=host.context, model_name=host.model_name)
        out = {}
        try:
            swarmkv.restore(ctx, 1, forged)
            out["forged"] = "restored"
        except SwarmKVError as exc:
            out["forged"] = str(exc)
        # a real device capture restores, a stale one (recaptured since) does not
        dev = swarmkv.capture(ctx, 0, pool, tuple(tokens), on_device=True)
        swarmkv.restore(ctx, 1, dev)
        out["device"] = ctx.seq_len(1)
        swarmkv.capture(ctx, 0, pool, tuple(tokens), on_device=True)
        try:
            swarmkv.restore(ctx, 1, dev)
            out["stale"] = "restored"
        except SwarmKVError as exc:
            out["stale"] = str(exc)
        out["seq0"] = ctx.seq_len(0)
        print(json.dumps(out))
"""


def test_a_snapshot_claiming_on_device_without_a_device_copy_is_refused(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    out = run_child(_ON_DEVICE_CHILD, str(tiny_model_path), cwd=tmp_path)
    assert "restores only into the context that captured it" in out["forged"], out
    assert out["device"] == 40, out
    assert "restores only into the context that captured it" in out["stale"], out
    assert out["seq0"] == 40, out


# -- restores refused before the native call ----------------------------------------------------
def _other_model_snapshot(
    other_tiny_model: Model, pool: HostBufferPool, prefix: tuple[int, ...], prefill: Prefill
) -> KVSnapshot:
    with Context(other_tiny_model, **CTX) as other:
        prefill(other, prefix, seq_id=0, logits_last=False)
        return swarmkv.capture(other, 0, pool, prefix)


def _with_state(snap: KVSnapshot, pool: HostBufferPool, edit: Callable[[bytearray], Any]) -> Any:
    state = bytearray(snap.data)
    edit(state)
    return KVSnapshot(
        pool.copy_of(bytes(state)),
        snap.tokens,
        snap.model_fingerprint,
        snap.flags,
        context=snap.context,
        model_name=snap.model_name,
    )


def _first_cell(state: bytes) -> int:
    """Offset of the first cell's metadata in a 2-stream state whose stream 0 holds it."""
    assert struct.unpack_from("<I", state, 8)[0] == 2
    return 16


REFUSALS: dict[str, tuple[str, Callable[..., KVSnapshot]]] = {
    "another model": (
        "model_fingerprint is",
        lambda snap, pool, other, prefix, prefill, tmp: _other_model_snapshot(
            other, pool, prefix, prefill
        ),
    ),
    "other context settings": (
        "context setting type_k is 'f32' in the snapshot",
        lambda snap, pool, *_: KVSnapshot(
            pool.copy_of(snap.data),
            snap.tokens,
            snap.model_fingerprint,
            context={**(snap.context or {}), "type_k": "f32"},
            model_name=snap.model_name,
        ),
    ),
    "released buffer": (
        "HostBuffer used after release",
        lambda snap, *_: (snap.release(), snap)[1],
    ),
    "released mapping": (
        "snapshot mapping used after release",
        lambda snap, pool, other, prefix, prefill, tmp: (
            (mapped := KVSnapshot.open_shared(snap.save(tmp / "s.swkv"))).release(),
            mapped,
        )[1],
    ),
    "too long for one sequence": (
        "exceeds the 256 cells of one sequence",
        lambda snap, *_: KVSnapshot(snap.buffer, tuple(range(300)), snap.model_fingerprint),
    ),
    "fewer tokens than cells": (
        "holds 64 positions but the snapshot names 63 tokens",
        lambda snap, *_: KVSnapshot(snap.buffer, snap.tokens[:-1], snap.model_fingerprint),
    ),
    "a repeated position": (
        "a cell position repeats",
        lambda snap, pool, *_: _with_state(
            snap, pool, lambda s: struct.pack_into("<i", s, _first_cell(s) + 12, 0)
        ),
    ),
    "a negative position": (
        r"cell positions span \[-2147483648, 63\]",
        lambda snap, pool, *_: _with_state(
            snap, pool, lambda s: struct.pack_into("<i", s, _first_cell(s), -(2**31))
        ),
    ),
    "a cell of two sequences": (
        "a cell belongs to more or fewer than one sequence",
        lambda snap, pool, *_: _with_state(
            snap, pool, lambda s: struct.pack_into("<I", s, _first_cell(s) + 4, 2)
        ),
    ),
    "trailing bytes": (
        "is not a sequence state of 64 tokens for this context",
        lambda snap, pool, *_: _with_state(snap, pool, lambda s: s.extend(b"\0" * 12)),
    ),
    "a truncated state": (
        "layer 1's V rows needs",
        lambda snap, pool, *_: _with_state(snap, pool, lambda s: s.__delitem__(slice(-100, None))),
    ),
    "another stream count": (
        "a cache has 3 KV streams, the context 2",
        lambda snap, pool, *_: _with_state(snap, pool, lambda s: struct.pack_into("<I", s, 8, 3)),
    ),
    "no magic": (
        "does not start with llama.cpp's magic",
        lambda snap, pool, *_: _with_state(snap, pool, lambda s: struct.pack_into("<I", s, 0, 7)),
    ),
}


@pytest.mark.parametrize("reason", sorted(REFUSALS))
def test_refused_restore_keeps_the_target_sequence(
    ctx: Context,
    snap: KVSnapshot,
    pool: HostBufferPool,
    other_tiny_model: Model,
    prefix: tuple[int, ...],
    prefill: Prefill,
    filled: tuple[Seq, Seq],
    tmp_path: Path,
    reason: str,
) -> None:
    match, make = REFUSALS[reason]
    bad = make(snap, pool, other_tiny_model, prefix, prefill, tmp_path)
    other, target = filled
    with pytest.raises(SwarmKVError, match=match) as info:
        swarmkv.restore(ctx, TARGET, bad)
    assert str(info.value).strip()
    target.assert_unchanged()  # refused before the native call: the sequence kept its content
    other.assert_unchanged()


# -- restores llama.cpp rejects -------------------------------------------------------------------
def test_llama_cpp_rejection_empties_the_target_and_nothing_else(
    ctx: Context,
    snap: KVSnapshot,
    pool: HostBufferPool,
    prefix: tuple[int, ...],
    suffix_token: int,
    prefill: Prefill,
    filled: tuple[Seq, Seq],
) -> None:
    other, _ = filled
    # layer 0's K type id says F32, the context's K is F16: the layout parses, llama.cpp
    # compares the type with its own and refuses
    k_type_at = _first_cell(bytes(snap.data)) + 12 * N_PREFIX + 8
    assert struct.unpack_from("<i", snap.data, k_type_at)[0] == 1  # GGML_TYPE_F16
    bad = _with_state(snap, pool, lambda s: struct.pack_into("<i", s, k_type_at, 0))
    with pytest.raises(SnapshotMismatchError, match=r"consumed 0 of \d+ bytes"):
        swarmkv.restore(ctx, TARGET, bad)
    assert ctx.seq_pos_max(TARGET) is None  # empty: never half a sequence
    other.assert_unchanged()
    # and the target takes a good snapshot afterwards, exactly
    swarmkv.restore(ctx, TARGET, snap)
    got = next_logits(ctx, TARGET, suffix_token, prefill)
    with Context(ctx.model, **CTX) as ref:
        prefill(ref, prefix, seq_id=0, logits_last=False)
        assert got == next_logits(ref, 0, suffix_token, prefill)


def test_llama_cpp_rejection_for_lack_of_cells_in_a_shared_stream(
    tiny_model: Model, pool: HostBufferPool, prompt_tokens: list[int], prefill: Prefill
) -> None:
    """kv_unified: every sequence shares one stream of 256 cells; 200 of them are taken by
    seq 0, so a 100-token snapshot fits one sequence's cells but not the free ones."""
    unified = {**CTX, "n_ctx": 256, "kv_unified": True}
    with Context(tiny_model, **unified) as src:
        prefill(src, prompt_tokens[:100], seq_id=0, logits_last=False)
        snap = swarmkv.capture(src, 0, pool, tuple(prompt_tokens[:100]))
    with Context(tiny_model, **unified) as ctx:
        prefill(ctx, prompt_tokens[100:300], seq_id=OTHER, logits_last=False)
        prefill(ctx, prompt_tokens[:20], seq_id=TARGET, logits_last=False)
        other = Seq(ctx, OTHER, prompt_tokens[0], prefill)
        with pytest.raises(SnapshotMismatchError, match="no free cells for it"):
            swarmkv.restore(ctx, TARGET, snap)
        assert ctx.seq_pos_max(TARGET) is None
        other.assert_unchanged()


@pytest.fixture
def suffix_token(prompt_tokens: list[int]) -> int:
    return prompt_tokens[N_PREFIX]
