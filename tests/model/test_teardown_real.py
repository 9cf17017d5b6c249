"""Ctrl-C and timeouts in the middle of real decodes (issue 9): each crashed with SIGSEGV
before every path joined the node threads before freeing native handles.

Ctrl-C is a real SIGINT sent to a `swarmkv run` process at several moments: during model
load or the prefill, and during branch decoding (restores in host mode). The process must
exit 130 with "interrupted" and nothing else. Timeouts run in process and must leave the
pool and memory where they were.
"""

from __future__ import annotations

import gc
import signal
import time
from pathlib import Path

import pytest

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv.llama.owned import Keeper

from support.memory import anon_rss_bytes
from support.proc import popen, swarmkv_cmd

pytestmark = pytest.mark.slow  # the slow tier: kill and timeout loops on the real model

MODES = ("fork", "host", "baseline")
QUESTIONS = [
    "\n\nQuestion: Who should security issues be reported to?\nAnswer:",
    "\n\nSummarize the text above in one sentence:",
    "\n\nList two things the policy asks reporters not to do:",
    "\n\nWhat is the first section about?",
]


@pytest.fixture(scope="module")
def doc_file(tmp_path_factory: pytest.TempPathFactory, doc_long: str) -> Path:
    path = tmp_path_factory.mktemp("teardown") / "doc.txt"
    path.write_text(doc_long, encoding="utf-8")
    return path


@pytest.mark.parametrize("delay_s", [1.0, 3.0, 6.0])
@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_exits_cleanly(doc_file: Path, mode: str, delay_s: float) -> None:
    branches = [a for q in QUESTIONS for a in ("--branch", q)]
    cmd = swarmkv_cmd("run", "--doc", str(doc_file), *branches)
    # -n 200: long enough that every delay lands mid-run
    proc = popen([*cmd, "--mode", mode, "-n", "200"], cwd=doc_file.parent)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, f"exit {proc.returncode}\n{err[-3000:]}"
    assert "swarmkv: interrupted" in err
    assert "Traceback" not in err and "Segmentation" not in err, err[-3000:]


def live_handles() -> int:
    """Native handles (model, contexts, batches, samplers) not yet freed."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Keeper) and o.finalizer.alive)


@pytest.mark.parametrize("mode", MODES)
def test_timeout_mid_decode_frees_everything(model: sk.Model, doc_long: str, mode: str) -> None:
    with Pipeline(model, n_threads=2) as pipe:
        pipe.prefill("doc", text=doc_long)
        for i, q in enumerate(QUESTIONS):
            pipe.branch(f"q{i}", prompt=q, n_predict=16)
        full = pipe.run(mode)
        handles, warm_rss = live_handles(), anon_rss_bytes()
        statuses, rss = [], []
        for timeout_s in (0.5, 2.0, 0.5, 2.0, 0.5, 2.0, 3.5):  # about 1 s per prefill chunk
            t0 = time.perf_counter()
            res = pipe.run(mode, timeout_s=timeout_s, raise_on_failure=False)
            assert time.perf_counter() - t0 < timeout_s + 15, "stopped within a few decodes"
            statuses += [o.status for o in res.outcomes.values()]
            del res  # a result's errors hold tracebacks, and with them the run's objects
            assert live_handles() == handles, "a stopped run left a native handle behind"
            rss.append(anon_rss_bytes())
        stats = pipe._pool.stats() if pipe._pool is not None else None
        again = pipe.run(mode)  # still usable, and still the same answers
    assert "cancelled" in statuses and "failed" not in statuses
    assert [b.tokens for b in again.branches.values()] == [b.tokens for b in full.branches.values()]
    if stats is not None:
        assert stats.n_in_use == 0 and stats.bytes_in_use == 0
    # Anonymous RSS after a run swings by about 150 MB here with glibc's arenas (measured:
    # 141-284 MiB in host mode, no trend); a stopped run that leaked its KV cache (31 MiB)
    # or compute buffer (514 MiB) would break this bound within the seven runs.
    assert max(rss) < warm_rss + 200 * 2**20, (warm_rss >> 20, [r >> 20 for r in rss])
