"""The benchmark's memory pass on the real model: each mode measured in a fresh process, its
KV bytes from llama.cpp's own accounting (patch 0006)."""

from __future__ import annotations

import pytest

import swarmkv as sk
from swarmkv_bench import memprobe
from swarmkv_bench.workload import BenchConfig, document, prompts_for

pytestmark = pytest.mark.slow  # the slow tier: a benchmark run


def test_each_mode_is_measured_in_a_fresh_process(model: sk.Model) -> None:
    cfg = BenchConfig(8, 300, 24)
    doc, prompts = document(model, cfg.doc_tokens), prompts_for(8, False)
    request = {"model": str(model.path), "threads": 2, "n_batch": 512, "n_ctx": None}
    got = {m: memprobe.measure(request | {"mode": m}, cfg, doc, prompts) for m in ("host", "fork")}
    for mode, mem in got.items():
        peak, loaded, kv = mem["peak_rss_bytes"], mem["model_rss_bytes"], mem["kv_bytes"]
        assert peak and loaded and kv, mode
        assert loaded < peak < 4 * 2**30, mode  # the model, then the run on top of it
    # fork holds all 8 branches in one context sized for them all (300 + 8 x ~35 cells: 3
    # blocks of 256); host (plain kernels: one branch at a time) holds the prefill's context
    # (300 + 16: 2 blocks) and, made before the prefill, its one branch context (300 + ~35:
    # 2 blocks) at once; all whole 256-cell blocks
    k_dim, v_dim = model.head_dims()
    block = 256 * model.n_layer * model.n_head_kv * (k_dim + v_dim) * 2  # f16 K and V
    fork, host = got["fork"]["kv_bytes"], got["host"]["kv_bytes"]
    assert (fork, host) == (3 * block, 4 * block)
