"""The llama-server peer for real: the binary built by bench/build_llama_server.sh, on the tiny
model, one np1 trial with two branches. Skipped when the server is not built: it is an
optional component, never part of `pip install`."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import swarmkv
from swarmkv_bench.peer import find_llama_server, run_peer_trial

DOC = "The quick brown fox jumps over the lazy dog. " * 8
PROMPTS = [" What does the fox do?", " Who is lazy?"]
NAMES = ["b1", "b2"]
N_PREDICT = 4
N_BATCH = 512
THREADS = 2

log = logging.getLogger(__name__)
SERVER = find_llama_server(Path(__file__).resolve().parents[2])

pytestmark = [
    pytest.mark.slow,  # the slow tier: the llama-server peer
    pytest.mark.peer,
    pytest.mark.skipif(
        SERVER is None, reason="llama-server not built (bench/build_llama_server.sh)"
    ),
]


Prefill = Callable[..., int]


def _greedy(model: swarmkv.Model, text: str, prefill: Prefill, n: int) -> list[int]:
    """SwarmKV's reference for the server's input: `text` tokenized as ONE string (with BOS),
    decoded greedily; the server sees document + prompt exactly so."""
    out: list[int] = []
    with swarmkv.Context(model, n_ctx=512, n_batch=N_BATCH, n_threads=THREADS) as ctx:
        row = prefill(ctx, model.tokenize(text))
        for _ in range(n):
            token = int(np.argmax(ctx.logits(row)))
            out.append(token)
            if model.is_eog(token):
                break
            row = prefill(ctx, [token])
    return out


def test_np1_trial_on_the_tiny_model(
    tiny_model_path: Path, tiny_model: swarmkv.Model, prefill: Prefill
) -> None:
    assert SERVER is not None
    baseline = {
        n: _greedy(tiny_model, DOC + p, prefill, N_PREDICT)
        for n, p in zip(NAMES, PROMPTS, strict=True)
    }
    rec = run_peer_trial(
        SERVER, tiny_model_path, doc=DOC, prompts=PROMPTS, n_predict=N_PREDICT, threads=THREADS,
        setup="np1", swa_full=False, flash_attn="auto", n_batch=N_BATCH, config_id="smoke",
        trial=0, is_warmup=False, baseline_tokens=baseline, branch_names=NAMES, timeout_s=120,
        tokenizer=tiny_model,
    )  # fmt: skip
    log.info("peer record: %s", rec.to_dict())
    assert rec.mode == "server-np1" and rec.branch_names == tuple(NAMES)
    assert rec.doc_tokens == len(tiny_model.tokenize(DOC))
    assert rec.tokens_generated == 2 * N_PREDICT
    assert rec.extra["failed_branches"] == 0, rec.fidelity_detail
    assert rec.prefill_ms is not None and rec.prefill_ms > 0
    assert math.isfinite(rec.e2e_ms) and rec.e2e_ms >= max(rec.end_ms)
    assert all(0 < a <= e for a, e in zip(rec.activation_ms, rec.end_ms, strict=True))
    assert rec.first_token_ms[0] < rec.end_ms[0] <= rec.first_token_ms[1]
    assert all(d > 0 for d in rec.decode_ms)
    assert rec.extra["server_start_ms"] > 0
    assert (rec.peak_rss_bytes or 0) > 1 << 20
    # np1's point: branch 2 reuses the document from the slot's cache.
    first, second = rec.extra["prompt_tokens_evaluated_b0"], rec.extra["prompt_tokens_evaluated_b1"]
    assert first >= rec.doc_tokens
    assert second < first / 2, rec.extra
    assert rec.extra["prompt_tokens_evaluated"] == first + second
    # Token ids: reported either way (per measuring.md only equality applies, and a mismatch
    # must show); branch 1 decodes exactly what the reference decodes, in one batch.
    assert rec.fidelity_ok is not None
    assert rec.fidelity_detail.startswith(f"b1: {N_PREDICT} tokens equal"), rec.fidelity_detail
