"""SIGKILL in the middle of KVSnapshot.save: the file under its final name is always whole.

A child process saves three snapshots (4, 3 and 2 MiB of a 4-layer tiny model's KV state)
onto one path, over and over; the parent kills it at a random (seeded) moment, 20 times.
After each kill the file under the final name loads, and its header and state are exactly
one of the three versions. The child does nothing but save (each version's header computed
once). One kill in four comes at a random moment of the loop; the others are armed: after
the random delay the parent waits for the next save's temporary file to appear, then kills
within a random 1 ms, in the ~2.5 ms a save spends writing and fsyncing it. The test counts the
kills that landed mid-write (the killed save's temporary file is still there) and requires
at least half of them.

What a kill leaves: write_atomically writes `.NAME.PID.RANDOM.tmp` beside the target and
renames it over the target once it is complete, so a save killed before the rename leaves that
hidden file behind (nothing can remove it after SIGKILL). It is never read by load or open_shared,
a later save (another PID) is not disturbed by it, and it can be deleted at any time; the
test checks all three.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import time
from pathlib import Path

import pytest

import swarmkv
from swarmkv import Context, HostBufferPool, KVSnapshot, Model
from swarmkv.kv.file import temp_files, temp_prefix

from support.decoding import prefill
from support.proc import popen, python_cmd
from support.scale import scaled
from support.tinymodel import make_tiny_model

pytestmark = pytest.mark.slow  # the slow tier: a SIGKILL loop

TRIALS = scaled(20, floor=10)  # SWARMKV_TEST_SCALE; at the floor still 5 kills mid-write
SEED = 20_240_611
MAX_DELAY_S = 0.3  # a few dozen saves
ARMED_DELAY_S = 0.001  # within the ~2.5 ms a save spends writing and fsyncing its temp file
LENGTHS = (2048, 1536, 1024)  # tokens of the three versions
MIN_MID_WRITE = TRIALS // 2


def armed(trial: int) -> bool:
    """Three kills in four wait for a save to be writing (see the module docstring)."""
    return trial % 4 != 0


# The child computes each version's header once: save() hashes the state and encodes the
# header in memory before it opens a file, and a kill then cannot touch the file system, so
# the loop spends its time where a kill matters (writing, fsync, rename).
_CHILD = """
import sys
import swarmkv.kv.snapshot
from swarmkv import HostBufferPool, KVSnapshot

headers, encoded = {}, {}
header, encode = KVSnapshot.header, swarmkv.kv.snapshot.encode
KVSnapshot.header = lambda self: headers.setdefault(id(self), header(self))
swarmkv.kv.snapshot.encode = lambda h: encoded.setdefault(id(h), encode(h))

target, *versions = sys.argv[1:]
pool = HostBufferPool()
snaps = [KVSnapshot.load(v, pool) for v in versions]
snaps[0].save(target)
print("ready", flush=True)
while True:
    for snap in snaps:
        snap.save(target)
"""


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three snapshot files of one sequence cut at LENGTHS tokens (F32 KV: 2 KiB a token)."""
    folder = tmp_path_factory.mktemp("kill")
    model_path = make_tiny_model(folder / "tiny-4-layers.gguf", seed=2, n_layer=4, n_head_kv=4)
    text = "SwarmKV prefills a shared document once and fans its state out. " * 300
    paths = []
    with Model(model_path) as model:
        tokens = model.tokenize(text)[: LENGTHS[0]]
        assert len(tokens) == LENGTHS[0]
        settings = {"n_ctx": 2048, "n_batch": 512, "type_k": "f32", "type_v": "f32"}
        with Context(model, n_threads=2, **settings) as ctx, HostBufferPool() as pool:
            prefill(ctx, tokens, logits_last=False)
            for n in LENGTHS:  # longest first: each version drops the tail of the last
                ctx.seq_rm(0, n, None)
                snap = swarmkv.capture(ctx, 0, pool, tuple(tokens[:n]))
                paths.append(snap.save(folder / f"v{n}.swkv"))
                snap.release()
    return paths


def _fingerprint(path: Path, pool: HostBufferPool) -> tuple[str, bytes]:
    """What a version is: its header without the creation time, and its state bytes."""
    header = swarmkv.read_snapshot_header(path)
    fields = {k: v for k, v in header.__dict__.items() if k != "created"}
    with KVSnapshot.load(path, pool) as snap:
        return json.dumps(fields, sort_keys=True, default=str), bytes(snap.data)


def test_sigkill_mid_save_leaves_the_old_or_the_new_file(
    versions: list[Path], tmp_path: Path
) -> None:
    pool = HostBufferPool()
    known = {_fingerprint(v, pool): v.name for v in versions}
    assert len(known) == len(versions)
    assert versions[-1].stat().st_size > 2 << 20  # the smallest is still over 2 MiB
    target = tmp_path / "prefix.swkv"
    rng = random.Random(SEED)
    seen: list[str] = []
    mid_write = 0
    mid_write_armed = 0
    n_armed = sum(map(armed, range(TRIALS)))
    killed_pids = []
    t0 = time.perf_counter()
    for trial in range(TRIALS):
        child = popen(python_cmd("-c", _CHILD, str(target), *map(str, versions)), cwd=tmp_path)
        try:
            ready, _, _ = select.select([child.stdout], [], [], 60)
            assert ready and child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr
            time.sleep(rng.uniform(0.0, MAX_DELAY_S))
            if armed(trial):  # wait for the next save's temporary file, then a moment
                deadline = time.perf_counter() + 2
                while not temp_files(target, child.pid) and time.perf_counter() < deadline:
                    pass
                until = time.perf_counter() + rng.uniform(0.0, ARMED_DELAY_S)
                while time.perf_counter() < until:  # sleep() is too coarse for this
                    pass
            assert child.poll() is None, "the child stopped saving by itself"
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            child.communicate()
        assert child.returncode == -signal.SIGKILL
        killed_pids.append(child.pid)
        if temp_files(target, child.pid):
            mid_write += 1
            mid_write_armed += armed(trial)
        # the final name holds one complete version, whatever the moment of the kill
        version = known.get(_fingerprint(target, pool))
        assert version is not None, f"trial {trial}: {target} is none of the versions"
        seen.append(version)
        assert pool.stats().n_in_use == 0

    leftovers = sorted(p.name for p in tmp_path.glob(f".{target.name}.*.tmp"))
    print(
        f"\n{TRIALS} SIGKILLs in {time.perf_counter() - t0:.1f} s: {mid_write} landed while the "
        f"temporary file was being written ({mid_write_armed} of the {n_armed} armed ones, "
        f"{mid_write - mid_write_armed} of the {TRIALS - n_armed} others); the file under "
        "the final name was "
        f"{dict((v, seen.count(v)) for v in sorted(set(seen)))}; "
        f"{len(leftovers)} temporary files left behind"
    )
    assert mid_write >= MIN_MID_WRITE, f"only {mid_write} of {TRIALS} kills landed mid-write"
    assert len(leftovers) == mid_write  # one per killed save, named by its process id
    prefixes = tuple(temp_prefix(target, pid) for pid in killed_pids)
    assert all(name.startswith(prefixes) for name in leftovers)

    # a new save works beside the leftovers and does not touch them; load never reads them
    with KVSnapshot.load(versions[1], pool) as snap:
        snap.save(target)
    assert known[_fingerprint(target, pool)] == versions[1].name
    assert sorted(p.name for p in tmp_path.glob(f".{target.name}.*.tmp")) == leftovers
    for name in leftovers:  # they are garbage, to be deleted at will
        (tmp_path / name).unlink()
    assert known[_fingerprint(target, pool)] == versions[1].name
    assert pool.stats().n_in_use == 0
    pool.close()
