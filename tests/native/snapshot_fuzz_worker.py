"""The snapshot fuzz loop, run in a child process by test_snapshot_fuzz.py (a crash there is a
failed test, not a dead test run). Not a test module: pytest collects test_*.py only.

    python snapshot_fuzz_worker.py CONFIG.json

CONFIG names the two tiny models, a work folder and the strategies to run with their example
counts. Each strategy is a hypothesis test (derandomized, no database: the same examples every
run) that mutates one pristine `.swkv` file of the seed-0 tiny model and hands the result to
KVSnapshot.load or KVSnapshot.open_shared and, when that succeeds, to restore() into seq 1 of
a context whose seq 0 holds another sequence. Every example must end in one of:

- load_refused: a SwarmKVError with a message, the pool as it was;
- refused: restore() raised before the native call (check_restorable refuses too), seq 1 holds
  exactly what it held (its state bytes re-captured are unchanged);
- rejected: llama.cpp refused the bytes: seq 1 is empty (seq_pos_max is None);
- exact: the restore succeeded and the state bytes are the pristine ones (up to the fields
  llama.cpp ignores: the source seq id and each cell's seq id): seq 1's logits after a suffix
  equal the pristine restore's bit for bit;
- faithful: the file holds other state bytes under a header whose digests match them (a
  digest is no signature: such a file is indistinguishable from a genuine one), the restore
  succeeded, seq 1 holds exactly the prefix positions 0..n-1, re-capturing seq 1 gives the
  file's state bytes back (up to the ignored fields), and its continuation after a suffix
  is bit for bit the one of the same bytes restored into a second context;

and in every case seq 0 is untouched: same positions, same state bytes and the same logits,
bit for bit, for a next token. The contexts are batch-invariant, which makes logits
independent of where in the cache the cells landed (and turns flash attention on). With
"unified": true in CONFIG the two sequences share one KV stream (kv_unified), otherwise each
has its own.

Before each example the child writes its strategy, index and mutation to progress.json and
the file to current.swkv in the work folder: after a crash the parent reports both. At the end
it prints one JSON line: {"counts": {strategy: n}, "outcomes": {strategy: {outcome: n}}}.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import struct
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import swarmkv
from swarmkv import Context, HostBufferPool, KVSnapshot, Model, SwarmKVError
from swarmkv.kv.snapshot import check_restorable

from support.decoding import prefill

CTX: dict[str, Any] = {
    "n_ctx": 512,
    "n_batch": 64,
    "n_seq_max": 2,
    "n_threads": 1,
    "batch_invariant": True,
}
TEXT = (
    "SwarmKV prefills a shared document once and fans its key-value state out to many "
    "branches, each of which continues the document with its own question. "
) * 12
N_PREFIX = 32  # the snapshot's tokens (a 16 KiB state: 2 layers, K and V, F16 rows of 32)
N_SUFFIX = 4
N_OTHER = 24  # seq 0's own sequence
N_SENTINEL = 6  # what seq 1 holds before each restore
TARGET, OTHER = 1, 0
PREFIX_SIZE = 20
DIGEST = 32
OUTCOMES = ("load_refused", "refused", "rejected", "exact", "faithful")


def bits(a: np.ndarray) -> bytes:
    """The exact bytes of a float array (NaN payloads included): equality is bit for bit."""
    return np.ascontiguousarray(a).tobytes()


# -- the .swkv file -----------------------------------------------------------------------------
def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(header fields, state bytes) of a well-formed version-2 file."""
    (header_len,) = struct.unpack_from("<I", data, 8)
    raw = data[PREFIX_SIZE : PREFIX_SIZE + header_len]
    return json.loads(raw), data[PREFIX_SIZE + header_len + DIGEST :]


def assemble(
    meta: dict[str, Any],
    state: bytes,
    *,
    redigest_state: bool = True,
    raw: bytes | None = None,
) -> bytes:
    """A self-consistent file: header with the state's length and sha256 (unless told not
    to), the prefix's lengths, the header's digest."""
    meta = dict(meta)
    if redigest_state:
        meta["nbytes"] = len(state)
        meta["sha256"] = hashlib.sha256(state).hexdigest()
    if raw is None:
        raw = json.dumps(meta, sort_keys=True).encode()
    nbytes = meta["nbytes"] if isinstance(meta.get("nbytes"), int) else len(state)
    prefix = b"SWKV" + struct.pack("<IIQ", 2, len(raw), nbytes % 2**64)
    return prefix + raw + hashlib.sha256(raw).digest() + state


# -- llama.cpp's sequence state (see swarmkv/kv/file.py) ------------------------------------
@dataclass
class Layout:
    """Offsets of the structural fields of the pristine state (one KV cache, 2 streams)."""

    cells: int
    cell_meta: int  # offset of the first cell's (pos, n_seq_id, seq_id)
    fields: list[tuple[int, int]] = field(default_factory=list)  # (offset, width)
    layer_fields: list[tuple[int, int]] = field(default_factory=list)  # K/V type and row size

    def normalized(self, state: bytes) -> bytes:
        """state with the fields llama.cpp ignores on restore zeroed: the source seq id and
        each cell's seq id (the restore puts every cell in the target sequence)."""
        out = bytearray(state)
        if len(out) >= 8:
            out[4:8] = bytes(4)
        for i in range(self.cells):
            at = self.cell_meta + 12 * i + 8
            if at + 4 <= len(out):
                out[at : at + 4] = bytes(4)
        return bytes(out)


def layout_of(state: bytes) -> Layout:
    """Walk one KV cache of n_stream streams, one of them holding cells (the tiny model)."""
    fields = [(0, 4), (4, 4), (8, 4)]
    (n_stream,) = struct.unpack_from("<I", state, 8)
    off = 12
    cells, cell_meta = 0, 0
    layer_fields: list[tuple[int, int]] = []
    for _ in range(n_stream):
        fields.append((off, 4))
        (count,) = struct.unpack_from("<I", state, off)
        off += 4
        if count == 0:
            continue
        cells, cell_meta = count, off
        for i in range(count):
            fields += [(off + 12 * i, 4), (off + 12 * i + 4, 4), (off + 12 * i + 8, 4)]
        off += 12 * count
        fields += [(off, 4), (off + 4, 4)]
        v_trans, n_layer = struct.unpack_from("<II", state, off)
        assert v_trans == 0
        off += 8
        for _ in range(2 * n_layer):  # K then V, each (type, row size, rows)
            layer_fields += [(off, 4), (off + 4, 8)]
            row = struct.unpack_from("<Q", state, off + 4)[0]
            off += 12 + count * row
    assert off == len(state), (off, len(state))
    return Layout(cells, cell_meta, fields + layer_fields, layer_fields)


# -- the harness ----------------------------------------------------------------------------------
class Harness:
    """Two batch-invariant contexts of the seed-0 tiny model, the pristine file, references."""

    def __init__(self, model_path: Path, other_path: Path, work: Path, unified: bool) -> None:
        self.work = work
        ctx_settings = {**CTX, "kv_unified": unified}
        self.model = Model(model_path)
        self.other_model = Model(other_path)
        tokens = self.model.tokenize(TEXT)
        self.prefix = tuple(tokens[:N_PREFIX])
        self.suffix = tokens[N_PREFIX : N_PREFIX + N_SUFFIX]
        other_tokens = tokens[100 : 100 + N_OTHER]
        self.refs = HostBufferPool()  # the harness's own snapshots
        self.pool = HostBufferPool()  # what load() allocates from: empty between examples
        self.ctx = Context(self.model, **ctx_settings)
        self.ctx_b = Context(self.model, **ctx_settings)  # for the determinism check

        # the pristine snapshot: the prefix decoded on seq 1, then saved
        self.decode(self.ctx, self.prefix, 0, TARGET)
        pristine = swarmkv.capture(self.ctx, TARGET, self.refs, self.prefix)
        self.file = pristine.save(work / "pristine.swkv").read_bytes()
        self.meta, self.state = split(self.file)
        self.layout = layout_of(self.state)
        self.pristine_norm = self.layout.normalized(self.state)
        self.header_len = struct.unpack_from("<I", self.file, 8)[0]
        self.ctx.seq_rm(TARGET)

        # the same prefix on the other model: a foreign header and foreign state bytes
        with Context(self.other_model, **ctx_settings) as octx:
            self.decode(octx, self.prefix, 0, TARGET)
            foreign = swarmkv.capture(octx, TARGET, self.refs, self.prefix)
            self.foreign_file = foreign.save(work / "foreign.swkv").read_bytes()
            foreign.release()
        self.foreign_meta, self.foreign_state = split(self.foreign_file)
        assert len(self.foreign_state) == len(self.state)

        # seq 0: another sequence, which no example may touch
        self.decode(self.ctx, other_tokens, 0, OTHER)
        self.other_state = self.capture_bytes(self.ctx, OTHER)
        self.other_next = self.next_logits()

        # seq 1's content before each restore, and the reference continuation of the prefix
        self.decode(self.ctx, self.prefix[:N_SENTINEL], 0, TARGET)
        self.sentinel = swarmkv.capture(self.ctx, TARGET, self.refs, self.prefix[:N_SENTINEL])
        self.sentinel_state = bytes(self.sentinel.data)
        swarmkv.restore(self.ctx, TARGET, pristine)
        self.ref_logits = bits(self.decode(self.ctx, self.suffix, N_PREFIX, TARGET))
        self.pristine = pristine
        self.target_is_sentinel = False
        self.n = 0
        self.path = work / "current.swkv"
        self.progress = work / "progress.json"
        self.outcomes: dict[str, Counter[str]] = {}
        self.counts: Counter[str] = Counter()

    # -- native helpers --
    @staticmethod
    def decode(ctx: Context, tokens: Any, pos0: int, seq: int) -> np.ndarray:
        return ctx.logits(prefill(ctx, list(tokens), seq_id=seq, pos0=pos0)).copy()

    @staticmethod
    def capture_bytes(ctx: Context, seq: int) -> bytes:
        buf = bytearray(ctx.state_seq_size(seq, ctx.exact_state_flags))
        ctx.state_seq_get(seq, memoryview(buf), ctx.exact_state_flags)
        return bytes(buf)

    def next_logits(self) -> bytes:
        """seq 0's logits for one more token; the token is removed again."""
        logits = self.decode(self.ctx, [self.suffix[0]], N_OTHER, OTHER)
        self.ctx.seq_rm(OTHER, N_OTHER, None)
        return bits(logits)

    def check_other(self) -> None:
        """seq 0 as it was: positions, state bytes, next-token logits bit for bit."""
        ctx = self.ctx
        assert (ctx.seq_pos_min(OTHER), ctx.seq_pos_max(OTHER)) == (0, N_OTHER - 1)
        assert self.capture_bytes(ctx, OTHER) == self.other_state, "seq 0's state changed"
        assert self.next_logits() == self.other_next, "seq 0's continuation changed"

    def reset_target(self) -> None:
        if not self.target_is_sentinel:
            swarmkv.restore(self.ctx, TARGET, self.sentinel)
            self.target_is_sentinel = True
        assert self.capture_bytes(self.ctx, TARGET) == self.sentinel_state

    # -- one example --
    def run(self, strategy: str, kind: str, data: bytes) -> str:
        """Write data as the snapshot file, load and restore it; the outcome (OUTCOMES)."""
        self.n += 1
        self.counts[strategy] += 1
        self.reset_target()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)  # a new inode: a mapping of the last file never sees this
        self.progress.write_text(
            json.dumps({"strategy": strategy, "example": self.counts[strategy], "kind": kind})
        )
        outcome = self._attempt(self.n % 2 == 1)
        self.check_other()
        assert self.pool.stats().n_in_use == 0, "a pool buffer was not given back"
        self.outcomes.setdefault(strategy, Counter())[outcome] += 1
        return outcome

    def _attempt(self, shared: bool) -> str:
        in_use = self.pool.stats().bytes_in_use
        try:
            if shared:
                snap = KVSnapshot.open_shared(self.path)
            else:
                snap = KVSnapshot.load(self.path, self.pool)
        except SwarmKVError as exc:
            assert str(exc).strip(), f"{type(exc).__name__} without a message"
            assert self.pool.stats().bytes_in_use == in_use
            return "load_refused"
        try:
            return self._restore(snap)
        finally:
            snap.release()

    def _restore(self, snap: KVSnapshot) -> str:
        ctx = self.ctx
        try:
            check_restorable(ctx, snap)
        except SwarmKVError as exc:
            assert str(exc).strip(), f"{type(exc).__name__} without a message"
            with_check = exc
        else:
            with_check = None
        try:
            swarmkv.restore(ctx, TARGET, snap)
        except SwarmKVError as exc:
            assert str(exc).strip(), f"{type(exc).__name__} without a message"
            if with_check is not None:  # refused before the native call: seq 1 as it was
                assert type(exc) is type(with_check) and str(exc) == str(with_check)
                assert self.capture_bytes(ctx, TARGET) == self.sentinel_state
                return "refused"
            self.target_is_sentinel = False
            assert ctx.seq_pos_max(TARGET) is None, "a rejected restore left cells in seq 1"
            return "rejected"
        assert with_check is None, f"check_restorable refused ({with_check}), restore did not"
        self.target_is_sentinel = False
        n = snap.n_tokens
        assert (ctx.seq_pos_min(TARGET), ctx.seq_pos_max(TARGET)) == (0, n - 1)
        state = bytes(snap.data)
        held = self.capture_bytes(ctx, TARGET)
        assert len(held) == len(state), "seq 1 holds another number of cells than the file"
        assert self.layout.normalized(held) == self.layout.normalized(state), (
            "seq 1's state is not the file's"
        )
        logits = bits(self.decode(ctx, self.suffix, n, TARGET))
        if self.layout.normalized(state) == self.pristine_norm:
            assert logits == self.ref_logits, "a pristine state continues differently"
            return "exact"
        ctx_b = self.ctx_b
        swarmkv.restore(ctx_b, TARGET, snap)
        again = bits(self.decode(ctx_b, self.suffix, n, TARGET))
        ctx_b.seq_rm(TARGET)
        assert logits == again, "the same state bytes continue differently in two contexts"
        return "faithful"


H: Harness  # set in main()

SETTINGS: dict[str, Any] = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": list(HealthCheck),
    # no shrinking: the first failing example is reported as it came (progress.json), and
    # replaying examples against a harness that a failure left behind would only confuse it
    "phases": (Phase.explicit, Phase.generate),
}


# -- strategies -----------------------------------------------------------------------------------
def file_size() -> int:
    return len(H.file)


def truncate(n: int) -> Callable[[], None]:
    @settings(max_examples=n, **SETTINGS)
    @given(data=st.data())
    def run(data: Any) -> None:
        cut = data.draw(st.integers(0, file_size() - 1), label="cut")
        assert H.run("truncate", f"cut at {cut}", H.file[:cut]) == "load_refused"

    return run


def bitflip(n: int) -> Callable[[], None]:
    def region(name: str, lo: int, hi: int) -> st.SearchStrategy[tuple[str, int]]:
        return st.integers(lo * 8, hi * 8 - 1).map(lambda b: (name, b))

    @settings(max_examples=n, **SETTINGS)
    @given(data=st.data())
    def run(data: Any) -> None:
        hl = H.header_len
        size = file_size()
        regions = st.one_of(
            region("prefix", 0, PREFIX_SIZE),
            region("header", PREFIX_SIZE, PREFIX_SIZE + hl),
            region("digest", PREFIX_SIZE + hl, PREFIX_SIZE + hl + DIGEST),
            region("state", PREFIX_SIZE + hl + DIGEST, size),
        )
        flips = data.draw(st.lists(regions, min_size=1, max_size=4), label="flips")
        out = bytearray(H.file)
        for _, b in flips:
            out[b // 8] ^= 1 << (b % 8)
        if bytes(out) == H.file:  # two flips of one bit: the file as it was
            out[0] ^= 1
        kind = ", ".join(f"{r} bit {b}" for r, b in flips)
        assert H.run("bitflip", kind, bytes(out)) == "load_refused"

    return run


def lengths(n: int) -> Callable[[], None]:
    def one(header_len: int, nbytes: int) -> None:
        out = bytearray(H.file)
        struct.pack_into("<IQ", out, 8, header_len, nbytes)
        before = H.pool.stats().bytes_allocated
        outcome = H.run("lengths", f"header_len {header_len}, nbytes {nbytes}", bytes(out))
        assert outcome == "load_refused"
        assert H.pool.stats().bytes_allocated == before, "a refused file allocated"

    @settings(max_examples=n - 2, **SETTINGS)
    @given(data=st.data())
    def run(data: Any) -> None:
        hl, nb = H.header_len, len(H.state)
        near = st.integers(-64, 64)
        header_len = data.draw(
            st.one_of(near.map(lambda d: hl + d), st.integers(0, 2**32 - 1), st.just(hl)).filter(
                lambda v: 0 <= v < 2**32
            ),
            label="header_len",
        )
        nbytes = data.draw(
            st.one_of(near.map(lambda d: nb + d), st.integers(0, 2**64 - 1), st.just(nb)).filter(
                lambda v: 0 <= v < 2**64
            ),
            label="nbytes",
        )
        if (header_len, nbytes) == (hl, nb):
            nbytes += 1
        one(header_len, nbytes)

    def explicit_then_fuzz() -> None:
        one(H.header_len, 8 << 30)  # a state of 8 GiB
        one(2**32 - 1, len(H.state))  # a header of 4 GiB
        run()

    return explicit_then_fuzz


def append(n: int) -> Callable[[], None]:
    @settings(max_examples=n, **SETTINGS)
    @given(extra=st.binary(min_size=1, max_size=4096))
    def run(extra: bytes) -> None:
        assert H.run("append", f"{len(extra)} bytes", H.file + extra) == "load_refused"

    return run


CONTEXT_CHANGES: dict[str, list[Any]] = {
    "type_k": ["q8_0", "f32", "bf16", None, 1],
    "type_v": ["q8_0", "f32", "q4_0"],
    "flash_attn": ["off", "auto", True],
    "swa_full": [False, None, "yes"],
    "n_stream": [1, 3, 0, -2, "2", 2.0001],
    "batch_invariant": [False, None, 0],
}


def foreign(n: int) -> Callable[[], None]:
    """Headers that only one check can catch: each file is self-consistent (every digest and
    length recomputed) and differs from the pristine one in one thing."""
    hex40 = st.text("0123456789abcdef", min_size=40, max_size=40)
    any_text = st.text(max_size=48)
    change = st.one_of(
        st.tuples(st.just("foreign model header"), st.just(None)),
        st.tuples(st.just("foreign model file"), st.just(None)),
        st.tuples(st.just("fingerprint"), hex40),
        st.tuples(st.just("llama_cpp_commit"), st.one_of(hex40, any_text)),
        st.tuples(
            st.just("patches"),
            st.lists(st.text("0123456789abcdefghijklmnopqrstuvwxyz-.", max_size=40), max_size=7),
        ),
        st.tuples(
            st.just("context"),
            st.sampled_from(sorted(CONTEXT_CHANGES)).flatmap(
                lambda k: st.tuples(st.just(k), st.sampled_from(CONTEXT_CHANGES[k]))
            ),
        ),
        st.tuples(st.just("context dropped"), st.sampled_from(sorted(CONTEXT_CHANGES))),
        st.tuples(st.just("state_flags"), st.integers(-8, 64)),
        st.tuples(
            st.just("tokens"),
            st.lists(st.integers(0, 31999), min_size=1, max_size=N_PREFIX + 40),
        ),
        st.tuples(
            st.just("same count, other ids"),
            st.lists(st.integers(0, 31999), min_size=N_PREFIX, max_size=N_PREFIX),
        ),
        st.tuples(st.just("too long"), st.integers(257, 600)),
    )

    @settings(max_examples=n, **SETTINGS)
    @given(change=change)
    def run(change: tuple[str, Any]) -> None:
        what, value = change
        meta, state = dict(H.meta), H.state
        if what == "foreign model header":
            meta = dict(H.foreign_meta)
        elif what == "foreign model file":
            meta, state = dict(H.foreign_meta), H.foreign_state
        elif what == "fingerprint":
            meta["model_fingerprint"] = value
        elif what in ("llama_cpp_commit", "patches"):
            meta[what] = value
        elif what == "context":
            key, new = value
            meta["context"] = {**meta["context"], key: new}
        elif what == "context dropped":
            meta["context"] = {k: v for k, v in meta["context"].items() if k != value}
        elif what == "state_flags":
            meta["state_flags"] = value
        elif what in ("tokens", "same count, other ids"):
            meta["tokens"], meta["n_tokens"] = value, len(value)
        else:  # too long for one sequence's 256 cells
            meta["tokens"], meta["n_tokens"] = list(range(value)), value
        outcome = H.run("foreign", f"{what}: {value!r}"[:200], assemble(meta, state))
        build_changed = (
            meta["llama_cpp_commit"] != H.meta["llama_cpp_commit"]
            or meta["patches"] != H.meta["patches"]
        )
        if build_changed:
            assert outcome == "load_refused"
        elif what in ("foreign model header", "foreign model file", "fingerprint"):
            assert outcome == "refused"
        elif what == "context":
            key, new = value
            same = new == H.meta["context"][key] and type(new) is type(H.meta["context"][key])
            assert outcome == ("exact" if same else "refused"), (outcome, value)
        elif what == "context dropped":
            assert outcome == "load_refused"
        elif what == "state_flags":
            legal = value >= 0 and not value & ~5  # PARTIAL_ONLY and KEEP_SWA_MASKED only
            # the tiny model has one KV cache, which reads either flag alike
            assert outcome == ("exact" if legal else "load_refused"), (outcome, value)
        elif what == "same count, other ids":
            assert outcome == "exact"  # token ids are not in a llama state: nothing to compare
        elif what == "tokens":
            assert outcome == ("exact" if len(value) == N_PREFIX else "refused")
        else:
            assert outcome == "refused"

    return run


INTERESTING = [0, 1, 2, 3, 4, 31, 32, 33, 255, 256, 2**31 - 1, 2**31, 2**32 - 1, 2**32 - 2]


def valid_header(n: int) -> Callable[[], None]:
    """A valid header (every digest recomputed) over mutated or garbage state bytes: load()
    accepts the file, so restore() and llama.cpp see the bytes."""
    kinds = st.sampled_from(
        [
            "flip",
            "flip metadata",
            "field",
            "layer header",
            "truncate",
            "extend",
            "splice foreign",
            "splice random",
            "garbage",
            "swap cells",
            "cell position",
            "foreign state",
        ]
    )

    @settings(max_examples=n, **SETTINGS)
    @given(kind=kinds, data=st.data())
    def run(kind: str, data: Any) -> None:
        state = bytearray(H.state)
        size = len(state)
        lay = H.layout
        meta_end = lay.cell_meta + 12 * lay.cells + 8 + 12  # through layer 0's K header
        if kind in ("flip", "flip metadata"):
            hi = size if kind == "flip" else meta_end
            flips = data.draw(st.lists(st.integers(0, hi * 8 - 1), min_size=1, max_size=8))
            for b in flips:
                state[b // 8] ^= 1 << (b % 8)
            what = f"bits {flips}"
        elif kind in ("field", "layer header"):
            fields = lay.fields if kind == "field" else lay.layer_fields
            at, width = data.draw(st.sampled_from(fields), label="field")
            value = data.draw(
                st.one_of(st.sampled_from(INTERESTING), st.integers(0, 2 ** (8 * width) - 1))
            )
            if kind == "layer header" and width == 4:  # a type id: mostly another valid one
                value = data.draw(st.one_of(st.integers(0, 42), st.just(value)))
            state[at : at + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")
            what = f"{width} bytes at {at} = {value}"
        elif kind == "truncate":
            cut = data.draw(st.integers(0, size - 1))
            del state[cut:]
            what = f"cut at {cut}"
        elif kind == "extend":
            extra = data.draw(st.binary(min_size=1, max_size=512))
            state += extra
            what = f"{len(extra)} bytes more"
        elif kind in ("splice foreign", "splice random"):
            a = data.draw(st.integers(0, size - 1))
            b = data.draw(st.integers(a + 1, min(size, a + 2048)))
            if kind == "splice foreign":
                state[a:b] = H.foreign_state[a:b]
            else:
                state[a:b] = data.draw(st.binary(min_size=b - a, max_size=b - a))
            what = f"[{a}, {b})"
        elif kind == "garbage":
            body = data.draw(st.binary(min_size=0, max_size=2 * size))
            keep = data.draw(st.integers(0, 16))  # keep the magic and maybe more
            state = bytearray(H.state[:keep] + body)
            what = f"{keep} bytes kept, {len(body)} random"
        elif kind == "swap cells":
            i = data.draw(st.integers(0, lay.cells - 1))
            j = data.draw(st.integers(0, lay.cells - 1).filter(lambda v: v != i))
            a, b = lay.cell_meta + 12 * i, lay.cell_meta + 12 * j
            state[a : a + 12], state[b : b + 12] = state[b : b + 12], state[a : a + 12]
            what = f"cells {i} and {j}"
        elif kind == "cell position":
            i = data.draw(st.integers(0, lay.cells - 1))
            pos = data.draw(
                st.one_of(
                    st.sampled_from([-1, -2, N_PREFIX, N_PREFIX - 1, 0, 2**31 - 1, -(2**31)]),
                    st.integers(-(2**31), 2**31 - 1),
                )
            )
            struct.pack_into("<i", state, lay.cell_meta + 12 * i, pos)
            what = f"cell {i} at position {pos}"
        else:
            state = bytearray(H.foreign_state)
            what = "the other model's state"
        if not state:
            state = bytearray(b"\0")  # a header needs a state of at least one byte
        outcome = H.run("valid_header", f"{kind}: {what}"[:300], assemble(H.meta, bytes(state)))
        if state[:4] != H.state[:4]:  # load() checks that the state starts with the magic
            assert outcome == "load_refused", outcome
            return
        assert outcome != "load_refused", "a valid header was refused"
        if kind == "cell position":
            assert outcome in ("refused", "exact")
        if kind in ("truncate", "extend", "garbage"):
            assert outcome in ("refused", "rejected")

    return run


def header_json(n: int) -> Callable[[], None]:
    """Header fields replaced by arbitrary JSON values (digests recomputed)."""
    json_values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False)
        | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=12,
    )
    keys = sorted(
        [
            "format",
            "model_fingerprint",
            "tokens",
            "state_flags",
            "nbytes",
            "sha256",
            "context",
            "llama_cpp_commit",
            "patches",
            "swarmkv_version",
            "model_name",
            "created",
            "n_tokens",
            "unknown_field",
        ]
    )

    @settings(max_examples=n, **SETTINGS)
    @given(changes=st.dictionaries(st.sampled_from(keys), json_values, min_size=1, max_size=3))
    @example(
        changes={
            "tokens": [
                [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
            ]
        }
    )
    def run(changes: dict[str, Any]) -> None:
        meta = {**H.meta, **changes}
        H.run("header_json", repr(changes)[:300], assemble(meta, H.state, redigest_state=False))

    return run


def deep_json(n: int) -> Callable[[], None]:
    """Raw header bytes that are not the JSON object of a header (digests recomputed)."""

    @settings(max_examples=n, **SETTINGS)
    @given(
        raw=st.one_of(
            st.binary(max_size=256),
            st.integers(1, 100_000).map(lambda d: b"[" * d + b"]" * d),
            st.text(max_size=64).map(str.encode),
        )
    )
    def run(raw: bytes) -> None:
        out = assemble(H.meta, H.state, redigest_state=False, raw=raw)
        assert H.run("deep_json", f"{len(raw)} bytes: {raw[:40]!r}", out) == "load_refused"

    return run


STRATEGIES: dict[str, Callable[[int], Callable[[], None]]] = {
    "truncate": truncate,
    "bitflip": bitflip,
    "lengths": lengths,
    "append": append,
    "foreign": foreign,
    "valid_header": valid_header,
    "header_json": header_json,
    "deep_json": deep_json,
}


def main() -> int:
    faulthandler.enable()
    config = json.loads(Path(sys.argv[1]).read_text())
    work = Path(config["work"])
    global H
    H = Harness(
        Path(config["model"]), Path(config["other_model"]), work, config.get("unified", False)
    )
    t0 = time.perf_counter()
    times: dict[str, float] = {}
    for name, n in config["strategies"].items():
        t = time.perf_counter()
        try:
            STRATEGIES[name](n)()
        except BaseException:
            traceback.print_exc()
            print(json.dumps({"failed": name, "progress": H.progress.read_text()}), flush=True)
            return 1
        times[name] = round(time.perf_counter() - t, 2)
    # the examples left the harness as it began
    H.check_other()
    H.reset_target()
    H.pool.check()
    result = {
        "counts": dict(H.counts),
        "outcomes": {k: dict(v) for k, v in H.outcomes.items()},
        "seconds": times,
        "total_seconds": round(time.perf_counter() - t0, 2),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
