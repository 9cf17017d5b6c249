"""Snapshot faults users met: concurrent saves to one path from one process, `snapshot info`
on a huge sparse file, `snapshot create -o` a path it cannot write, and Ctrl-C in the middle
of `snapshot create`.

The save and info tests use synthetic states (llama.cpp's magic, then seeded bytes): saving,
loading and describing a file never parse the state further, so no decode is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import struct
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmkv import HostBufferPool, KVSnapshot, Model, Pipeline
from swarmkv._native import BUILD, LLAMA_CPP_COMMIT
from swarmkv.cli.app import main
from swarmkv.kv.file import CONTEXT_FIELDS, STATE_MAGIC, SnapshotHeader, encode
from swarmkv.process.interrupt import INTERRUPT, Interrupted

from support.proc import popen, python_cmd, run, stderr_tail, swarmkv_cmd
from support.tinymodel import make_tiny_model

CONTEXT = dict.fromkeys(CONTEXT_FIELDS, 0)
GIB = 1 << 30


def synthetic_state(nbytes: int, seed: int) -> bytes:
    """nbytes that start like a llama.cpp sequence state (magic, seq id 0), then noise."""
    rest = random.Random(seed).randbytes(nbytes - 8)
    return struct.pack("<Ii", STATE_MAGIC, 0) + rest


def header_for(state_len: int, sha256: str, tokens: tuple[int, ...] = (1, 2, 3)) -> bytes:
    """A consistent `.swkv` prefix and header of this build for a state of state_len bytes."""
    header = SnapshotHeader(
        model_fingerprint="f" * 64,
        tokens=tokens,
        state_flags=0,
        nbytes=state_len,
        sha256=sha256,
        context=CONTEXT,
        llama_cpp_commit=LLAMA_CPP_COMMIT,
        patches=tuple(BUILD["patches"]),
        model_name="synthetic",
    )
    return encode(header)


@pytest.fixture
def pool() -> Iterator[HostBufferPool]:
    with HostBufferPool() as p:
        yield p


# -- 1. concurrent saves from one process ---------------------------------------------------------
SAVERS = 4
SAVES_EACH = 12
VERSION_BYTES = (3 << 20, 2 << 20, 1 << 20)  # three states of different sizes


def test_concurrent_saves_to_one_path_are_each_atomic(pool: HostBufferPool, tmp_path: Path) -> None:
    """Threads of one process saving to one path each write their own temporary file: no save
    fails, and a reader loading the path all the while only ever sees a complete version."""
    versions = []
    for i, n in enumerate(VERSION_BYTES):
        tokens = tuple(range(1, 2 + i))
        snap = KVSnapshot(
            pool.copy_of(synthetic_state(n, seed=i)), tokens, "f" * 64, 0, context=CONTEXT
        )
        versions.append(snap)
    known = {(s.tokens, hashlib.sha256(s.data).hexdigest()) for s in versions}
    target = tmp_path / "shared.swkv"
    versions[0].save(target)

    stop = threading.Event()
    errors: list[str] = []
    loads: list[tuple[tuple[int, ...], str]] = []

    def saver(snap: KVSnapshot) -> None:
        try:
            for _ in range(SAVES_EACH):
                snap.save(target)
        except Exception as exc:
            errors.append(f"save: {exc!r}")

    def reader() -> None:
        while not stop.is_set():
            try:
                with KVSnapshot.load(target, pool) as got:
                    loads.append((got.tokens, hashlib.sha256(got.data).hexdigest()))
            except Exception as exc:
                errors.append(f"load: {exc!r}")

    threads = [
        threading.Thread(target=saver, args=(versions[i % len(versions)],)) for i in range(SAVERS)
    ]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    watcher.join(120)
    assert not errors, f"{len(errors)} failures, {len(loads)} good loads; first: {errors[:3]}"
    assert loads, "the reader never loaded the file"
    assert set(loads) <= known  # every load is one whole version
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.swkv"]  # no temp left
    with KVSnapshot.load(target, pool) as final:
        assert (final.tokens, hashlib.sha256(final.data).hexdigest()) in known
    for snap in versions:
        snap.release()
    assert pool.stats().n_in_use == 0


def test_a_stale_temporary_file_does_not_block_a_save(pool: HostBufferPool, tmp_path: Path) -> None:
    """What a SIGKILLed save by a process of this PID left (a file or a directory named like
    a temporary file, the old `.NAME.PID.tmp` among them) neither blocks a new save nor is
    touched by it."""
    state = synthetic_state(4096, seed=7)
    snap = KVSnapshot(pool.copy_of(state), (1, 2), "f" * 64, 0, context=CONTEXT)
    target = tmp_path / "prefix.swkv"
    snap.save(target)
    pid = os.getpid()
    stale_dirs = [tmp_path / f".{target.name}.{pid}.tmp", tmp_path / f".{target.name}.{pid}.x.tmp"]
    stale_file = tmp_path / f".{target.name}.{pid}.stale.tmp"
    for d in stale_dirs:
        d.mkdir()
    stale_file.write_bytes(b"half a file")
    before = sorted(p.name for p in tmp_path.iterdir())
    snap.save(target)
    with KVSnapshot.load(target, pool) as got:
        assert bytes(got.data) == state
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # left alone, no new temp
    assert stale_file.read_bytes() == b"half a file"
    snap.release()


# -- 2. `snapshot info` on a huge sparse file ------------------------------------------------------
_INFO_CHILD = """
import json, resource, sys, time
import swarmkv._native  # loaded by the info command too: part of the baseline
from swarmkv.cli.app import main

def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

rss0, t0 = peak(), time.perf_counter()
code = main(["snapshot", "info", sys.argv[1], "--json"])
seconds = time.perf_counter() - t0
print(json.dumps({"code": code, "seconds": seconds, "peak_growth": peak() - rss0}))
"""


def _info(path: Path) -> dict[str, Any]:
    proc = run(python_cmd("-c", textwrap.dedent(_INFO_CHILD), str(path)), cwd=path.parent)
    assert proc.returncode == 0, stderr_tail(proc)
    *facts_lines, stats_line = proc.stdout.strip().splitlines()
    return {"facts": json.loads("\n".join(facts_lines)), **json.loads(stats_line)}


@pytest.mark.parametrize("state_start", ["a hole", "llama.cpp's magic, then a hole"])
def test_info_on_a_huge_sparse_file_reads_only_what_it_reports(
    tmp_path: Path, state_start: str
) -> None:
    """A consistent header claiming a state of gigabytes that the file really holds, as a
    hole: info answers in bounded time and memory (no copy of the state in memory)."""
    # a hole is refused at its first bytes; a state that starts right is hashed, a chunk at a
    # time (the checksum is what info reports): bounded memory, time linear in the state
    size = 2 * GIB if state_start == "a hole" else GIB // 2
    path = tmp_path / "huge.swkv"
    start = b"" if state_start == "a hole" else struct.pack("<Ii", STATE_MAGIC, 0)
    with path.open("wb") as f:
        f.write(header_for(size, "0" * 64))
        f.write(start)
        f.truncate(f.tell() - len(start) + size)
    assert path.stat().st_blocks * 512 < 1 << 20  # sparse: nothing on disk
    out = _info(path)
    facts = out["facts"]
    print(f"\ninfo on {size >> 30} GiB sparse ({state_start}): {out}")
    assert out["code"] == 1  # the state is not what its header says
    assert facts["checksum"].startswith("MISMATCH"), facts
    assert facts["state_bytes"] == size and facts["file_bytes"] == path.stat().st_size
    assert facts["this_build"] == "compatible"
    assert out["seconds"] < (4 if state_start == "a hole" else 10), "info read too much"
    assert out["peak_growth"] < 64 << 20, "info held the state in memory"


def test_info_on_a_sound_file_reports_ok(tmp_path: Path) -> None:
    state = synthetic_state(3 << 20, seed=3)
    path = tmp_path / "sound.swkv"
    path.write_bytes(header_for(len(state), hashlib.sha256(state).hexdigest()) + state)
    out = _info(path)
    assert out["code"] == 0, out
    facts = out["facts"]
    assert facts["checksum"] == "ok" and facts["this_build"] == "compatible", facts
    assert facts["file_bytes"] == path.stat().st_size and facts["state_bytes"] == len(state)
    assert facts["tokens"] == 3


# -- 3. `snapshot create -o` a path it cannot write ------------------------------------------------
# -m names a model file that does not exist, so an error about the output path proves that the
# path was checked first (a model load, then the whole prefill, used to come before it).
NO_MODEL = "no-such-model.gguf"


def _create(tmp_path: Path, output: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    doc = tmp_path / "doc.txt"
    doc.write_text("A short document.\n")
    code = main(["snapshot", "create", "--doc", str(doc), "-o", output, "-m", NO_MODEL])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("folder", "it is a directory"),
        ("missing/x.swkv", "no folder"),
        ("file.txt/x.swkv", "file.txt is not a folder"),
    ],
)
def test_create_refuses_an_unusable_output_before_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str, reason: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("not a folder")
    out = str(tmp_path / output)
    code, err = _create(tmp_path, out, capsys)
    assert code == 2, err
    assert f"cannot save a snapshot to {out}" in err and reason in err, err
    assert NO_MODEL not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.txt", "file.txt", "folder"]


@pytest.mark.parametrize("where", ["a read-only folder (chmod 500)", "/sys (no files)"])
def test_create_refuses_an_unwritable_folder_before_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    if where.startswith("/sys"):
        folder = Path("/sys")
        if not folder.is_dir():
            pytest.skip("no /sys")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
    out = str(folder / "x.swkv")
    try:
        code, err = _create(tmp_path, out, capsys)
    finally:
        if folder != Path("/sys"):
            folder.chmod(0o700)
    assert code == 2, err
    assert f"cannot save a snapshot to {out}" in err, err
    assert NO_MODEL not in err, err
    assert not Path(out).exists()
    if folder != Path("/sys"):
        assert list(folder.iterdir()) == []  # the probe left nothing behind


# -- 4. Ctrl-C during `snapshot create` -----------------------------------------------------------
def test_pipeline_snapshot_stops_between_prefill_chunks(tiny_model: Model) -> None:
    """Pipeline.snapshot's check() runs between prefill chunks; what it raises stops the
    prefill, and nothing is captured. By default it is the process's Ctrl-C flag."""
    pool = HostBufferPool()
    with Pipeline(tiny_model, n_batch=64, n_threads=1) as pipe:
        pipe.prefill("doc", text="A document of a few hundred tokens, in chunks. " * 40)
        calls: list[int] = []

        def stop_at_third() -> None:
            calls.append(len(calls))
            if len(calls) == 3:
                raise Interrupted("stop")

        with pytest.raises(Interrupted, match="stop"):
            pipe.snapshot(pool, check=stop_at_third)
        assert len(calls) == 3
        INTERRUPT.set()  # what a CLI's Ctrl-C handler does
        try:
            with pytest.raises(Interrupted):
                pipe.snapshot(pool)
        finally:
            INTERRUPT.clear()
        with pipe.snapshot(pool) as snap:  # and without a stop, a whole snapshot
            assert snap.n_tokens > 64 * 3
    assert pool.stats().n_in_use == 0


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model that takes a 25k-token document (about 25 s of single-thread prefill)."""
    folder = tmp_path_factory.mktemp("ctrl-c")
    return make_tiny_model(folder / "tiny-long.gguf", seed=0, n_ctx_train=32768)


def test_ctrl_c_during_snapshot_create_stops_the_prefill(
    long_context_model: Path, tmp_path: Path
) -> None:
    """SIGINT once the prefill runs: exit 130 within a chunk or two, no file written."""
    doc = tmp_path / "doc.txt"
    doc.write_text("SwarmKV prefills a shared document once and fans its state out. " * 1500)
    out = tmp_path / "doc.swkv"
    cmd = swarmkv_cmd(
        "snapshot", "create", "--doc", str(doc), "-o", str(out), "-m", str(long_context_model)
    )
    proc = popen([*cmd, "-t", "1", "-v"], cwd=tmp_path)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # -v: llama.cpp logs the capturing context's creation
        seen.append(line)
        if "constructing llama_context" in line:
            break
    else:
        proc.wait(30)
        pytest.fail(f"exit {proc.returncode} before any context: {''.join(seen)[-3000:]}")
    time.sleep(0.5)  # into the prefill: its first chunks take milliseconds each
    assert proc.poll() is None, f"exit {proc.returncode} before the signal: {proc.communicate()}"
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=10)
    except Exception:
        proc.kill()
        proc.communicate()
        raise
    seconds = time.perf_counter() - t0
    tail = "\n".join(ln for ln in err.splitlines() if "swarmkv.llama" not in ln)[-3000:]
    what = f"exit {proc.returncode} {seconds:.1f} s after Ctrl-C\n{tail}"
    assert proc.returncode == 130, what
    assert seconds < 8, what
    assert "swarmkv: interrupted" in err and "Traceback" not in err, what
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.txt"], what  # no file, no temp
