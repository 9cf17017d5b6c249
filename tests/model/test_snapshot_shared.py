"""Four worker processes restore one snapshot file from one shared mapping, with fidelity.

KVSnapshot.open_shared maps a `.swkv` file read-only and MAP_SHARED: every process that maps
it reads the same page-cache pages, so N workers starting from one document hold one copy of
its state, not N. Proved here on the real model with a document of about 3500 tokens (the
benchmark's size): 4 spawned processes each load the model, open the file shared, restore
it, decode a suffix greedily and, while all 4 still hold the mapping, read the mapping's
entry in /proc/self/smaps. Their tokens and every step's logits equal those of the context
that prefilled the document itself; their Pss of the mapping sums to one copy of the state
and none of its pages is private to a worker. As a contrast each worker then loads the same
file with KVSnapshot.load (a private copy in a pool buffer) and reports its anonymous RSS
growth: one copy per worker. Numbers are printed; run with -s to see them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import swarmkv as sk
from swarmkv.kv.snapshot import KVSnapshot

from support.decoding import continue_greedy, prefill
from support.memory import anon_rss_bytes
from support.realmodel import DOC_SOURCE

N_WORKERS = 4
N_DOC = 3500
N_CTX = 4096
N_PREDICT = 8
SUFFIX = "\n\nQuestion: What should a reporter of a security issue do?\nAnswer:"
WAIT_S = 240  # a worker stuck this long at a barrier means another one died
SMAPS_FIELDS = ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")

pytestmark = [
    pytest.mark.slow,  # the slow tier: four worker processes on a 3500-token document
    pytest.mark.skipif(
        not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps"
    ),
]


def _document_tokens(model: sk.Model, n_tokens: int) -> list[int]:
    """n_tokens tokens (BOS included) of natural prose: SECURITY.md then CONTRIBUTING.md of
    the pinned llama.cpp tree (support.realmodel.document's source alone is ~1700 tokens)."""
    text = DOC_SOURCE.read_text(encoding="utf-8")
    text += "\n\n" + (DOC_SOURCE.parent / "CONTRIBUTING.md").read_text(encoding="utf-8")
    tokens = model.tokenize(text)
    assert len(tokens) >= n_tokens, f"the source text has only {len(tokens)} tokens"
    return tokens[:n_tokens]


def _mapping_kb(path: Path) -> dict[str, int]:
    """The smaps fields (kB) of this process's mappings of path, summed (open_shared maps
    the whole file once)."""
    target = str(path.resolve())
    out = dict.fromkeys(SMAPS_FIELDS, 0)
    n_maps = 0
    inside = False
    with open("/proc/self/smaps", encoding="utf-8") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:  # a mapping's header
                inside = len(head) == 6 and head[5].strip() == target
                n_maps += inside
            elif inside and head[0].rstrip(":") in out:
                out[head[0].rstrip(":")] += int(head[1])
    out["n_maps"] = n_maps
    return out


def _worker(rank: int, path: str, suffix: list[int], pos0: int, barrier: Any, results: Any) -> None:
    """One worker: its own model and context, the snapshot restored from the shared mapping,
    a greedy continuation, then the mapping's smaps numbers while every worker holds it."""
    try:
        out: dict[str, Any] = {"rank": rank, "pid": os.getpid()}
        t = time.perf_counter()
        with sk.Model(sk.default_model_path()) as model:
            out["model_load_s"] = time.perf_counter() - t
            # one thread each: 4 workers share the machine's cores
            with sk.Context(model, n_ctx=N_CTX, batch_invariant=True, n_threads=1) as ctx:
                t = time.perf_counter()
                snap = KVSnapshot.open_shared(path)  # verifies the state's sha256: reads it all
                out["open_shared_ms"] = (time.perf_counter() - t) * 1e3
                assert snap.shared
                out["restore_ms"] = sk.restore(ctx, 0, snap)
                tokens, logits = continue_greedy(ctx, 0, suffix, pos0, n=N_PREDICT)
                out["tokens"], out["logits"] = tokens, np.stack(logits)
                # every worker has mapped and read every page before anyone measures, and
                # nobody unmaps before everyone has measured
                barrier.wait(WAIT_S)
                out["shared"] = _mapping_kb(Path(path))
                barrier.wait(WAIT_S)
                snap.release()
                out["after_release"] = _mapping_kb(Path(path))["n_maps"]
            # the contrast: KVSnapshot.load reads the state into a private pool buffer
            with sk.HostBufferPool() as pool:
                before = anon_rss_bytes(settle=False)
                t = time.perf_counter()
                loaded = KVSnapshot.load(path, pool)
                out["load_ms"] = (time.perf_counter() - t) * 1e3
                out["load_anon_growth"] = anon_rss_bytes(settle=False) - before
                loaded.release()
        results.put(out)
    except BaseException:
        barrier.abort()  # release the others instead of leaving them at the barrier
        results.put({"rank": rank, "error": traceback.format_exc()})


def _collect(results: Any, workers: list[Any]) -> list[dict[str, Any]]:
    """Every worker's result. The queue is drained before any join (a child blocks on exit
    until what it put is read); a worker that died without a word fails the test at once."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 2 * WAIT_S
    while len(got) < len(workers):
        try:
            got.append(results.get(timeout=5))
        except queue.Empty:
            dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            assert not dead, f"a worker died with exit code {dead[0]} (signal if < 0)"
            assert time.monotonic() < deadline, f"only {len(got)} workers reported"
    return got


def test_workers_restore_one_shared_copy_with_fidelity(model: sk.Model, tmp_path: Path) -> None:
    """4 processes restoring one open_shared file: bit-identical continuations (tokens and
    every step's logits) to the context that prefilled the document; together they hold one
    copy of the state (sum of Pss within 10% of nbytes, no private page), where load() gives
    each its own copy."""
    doc = _document_tokens(model, N_DOC)
    suffix = model.tokenize(SUFFIX, add_special=False)
    with sk.HostBufferPool() as pool:
        with sk.Context(model, n_ctx=N_CTX, batch_invariant=True) as ctx:
            t = time.perf_counter()
            prefill(ctx, doc, logits_last=False)
            prefill_s = time.perf_counter() - t
            snap = sk.capture(ctx, 0, pool, tuple(doc))
            path = snap.save(tmp_path / "doc.swkv")
            # The reference decodes in the context that prefilled the document, with this
            # process's thread count; the workers use one thread each. Batch-invariant
            # kernels do not depend on the thread count (the comparison below checks that too).
            ref_tokens, ref_logits = continue_greedy(ctx, 0, suffix, len(doc), n=N_PREDICT)
        nbytes = snap.nbytes
        snap.release()
    file_size = path.stat().st_size

    spawn = mp.get_context("spawn")  # fresh interpreters: nothing inherited from this one
    barrier, results = spawn.Barrier(N_WORKERS), spawn.Queue()
    args = (str(path), suffix, len(doc), barrier, results)
    workers = [spawn.Process(target=_worker, args=(r, *args)) for r in range(N_WORKERS)]
    t = time.perf_counter()
    for w in workers:
        w.start()
    try:
        got = sorted(_collect(results, workers), key=lambda r: r["rank"])
    finally:
        for w in workers:
            w.join(timeout=60)
            if w.is_alive():
                w.kill()
    workers_s = time.perf_counter() - t
    errors = [r["error"] for r in got if "error" in r]
    assert not errors, "\n".join(errors)

    print(
        f"\n[shared snapshot] doc {len(doc)} tokens, prefill {prefill_s:.1f} s; file "
        f"{file_size} B, state {nbytes} B ({nbytes / 2**20:.1f} MiB); {N_WORKERS} workers in "
        f"{workers_s:.1f} s"
    )
    for r in got:
        s = r["shared"]
        print(
            f"  worker {r['rank']}: model load {r['model_load_s']:.2f} s, open_shared "
            f"{r['open_shared_ms']:.1f} ms, restore {r['restore_ms']:.1f} ms; mapping Rss "
            f"{s['Rss']} kB, Pss {s['Pss']} kB, Shared_Clean {s['Shared_Clean']} kB, private "
            f"{s['Private_Clean'] + s['Private_Dirty']} kB | load() {r['load_ms']:.1f} ms, "
            f"anon RSS +{r['load_anon_growth'] / 2**10:.0f} kB"
        )
    pss = sum(r["shared"]["Pss"] for r in got) * 1024
    private = sum(r["load_anon_growth"] for r in got)
    print(
        f"  sum of Pss of the mapping: {pss / 2**20:.1f} MiB ({pss / nbytes:.3f} x nbytes); "
        f"load() private copies: {private / 2**20:.1f} MiB ({private / nbytes:.2f} x nbytes)"
    )

    for r in got:
        assert r["tokens"] == ref_tokens, f"worker {r['rank']}: {r['tokens']} != {ref_tokens}"
        assert np.array_equal(r["logits"], np.stack(ref_logits)), f"worker {r['rank']} logits"
        s = r["shared"]
        assert s["n_maps"] == 1, f"worker {r['rank']} mapped the file {s['n_maps']} times"
        # each worker sees the whole state resident ...
        assert s["Rss"] * 1024 >= nbytes, f"worker {r['rank']}: Rss {s['Rss']} kB"
        # ... and none of it is its own: every page is shared with the other workers
        assert (s["Private_Clean"] + s["Private_Dirty"]) * 1024 <= 0.01 * nbytes, r["rank"]
        assert s["Shared_Dirty"] == 0, r["rank"]  # read-only: nothing was written
        assert r["after_release"] == 0, f"worker {r['rank']}: release() left the mapping"
    # one copy between the four: Pss splits each shared page's size between its mappers
    assert abs(pss - nbytes) <= 0.1 * nbytes, f"sum of Pss {pss} B vs state {nbytes} B"
