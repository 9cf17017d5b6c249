"""Plain mode (exact=False) computes upstream llama.cpp's numerics, bit for bit: SwarmKV's
patches change nothing outside batch-invariant mode unless a context asks for it.

An unpatched build of the pinned tree (bench/build_upstream.sh: build/upstream/) and the
driver tests/support/logits_dump.c, built against it, give the reference: the default model
decoded in chunks of several shapes (rows >= 16, where patch 0004's skinny GEMM would serve;
odd sizes; single rows, where vec_dot serves), the logits of each chunk's last row.
  - the same driver against SwarmKV's libraries (LD_LIBRARY_PATH) writes the same bytes;
  - SwarmKV's own Context in plain mode, the same settings, gives the same logits;
  - the control: a plain context that asks for the skinny GEMM (kernel switch skinny_gemm=2)
    differs, so the comparison can fail.
Skipped when build/upstream is not built (optional, never part of `pip install`; CI builds it).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import swarmkv as sk
from swarmkv.llama.batch import Batch

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "build" / "upstream" / "logits_dump"
UPSTREAM_LIBS = ROOT / "build" / "upstream" / "cmake" / "bin"
# SwarmKV's libraries sit beside its compiled binding (an editable install keeps them apart
# from the Python sources)
_BINDING = importlib.util.find_spec("swarmkv._native._llama")
assert _BINDING is not None and _BINDING.origin is not None
OURS = Path(_BINDING.origin).parent
# chunk sizes: two of 64 rows (tinyBLAS, the repacked gemm), an odd one, then single rows
CHUNKS = (64, 64, 45, 1, 1, 1)
N_CTX, N_BATCH, THREADS = 1024, 512, 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.upstream,
    pytest.mark.skipif(
        not DRIVER.is_file(), reason="no unpatched build (bash bench/build_upstream.sh)"
    ),
]


@pytest.fixture(scope="module")
def tokens(model: sk.Model, doc_short: str) -> list[int]:
    toks = model.tokenize(doc_short)[: sum(CHUNKS)]
    assert len(toks) == sum(CHUNKS)
    return toks


def driver_logits(tokens: list[int], libs: Path, tmp: Path) -> np.ndarray:
    """The driver's logits (one row per chunk) against the libraries in libs."""
    src, out = tmp / f"tokens-{libs.name}.bin", tmp / f"logits-{libs.name}.bin"
    np.asarray(tokens, dtype=np.int32).tofile(src)
    args = [str(DRIVER), str(sk.default_model_path()), str(src), str(out)]
    args += [str(N_CTX), str(N_BATCH), str(THREADS), "1", *map(str, CHUNKS)]
    env = {**os.environ, "LD_LIBRARY_PATH": str(libs)}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return np.fromfile(out, dtype=np.float32).reshape(len(CHUNKS), -1)


def swarmkv_logits(model: sk.Model, tokens: list[int], **switches: int) -> np.ndarray:
    """SwarmKV's plain-mode context with the driver's settings, decoding the same chunks."""
    cfg = sk.ContextConfig(
        n_ctx=N_CTX,
        n_batch=N_BATCH,
        n_threads=THREADS,
        flash_attn="on",
        swa_full=True,
        kernel_switches=switches,
    )
    rows = []
    with sk.Context(model, cfg) as ctx, Batch(N_BATCH) as batch:
        pos = 0
        for n in CHUNKS:
            batch.clear()
            for i in range(n):
                batch.add(tokens[pos + i], pos + i, (0,), logits=i == n - 1)
            ctx.decode(batch)
            rows.append(np.array(ctx.logits(n - 1)))
            pos += n
    return np.stack(rows)


def test_swarmkvs_libraries_compute_upstreams_bits(tokens: list[int], tmp_path: Path) -> None:
    upstream = driver_logits(tokens, UPSTREAM_LIBS, tmp_path)
    ours = driver_logits(tokens, OURS, tmp_path)
    np.testing.assert_array_equal(ours, upstream)


def test_a_plain_context_computes_upstreams_bits(
    repacked_model: sk.Model, tokens: list[int], tmp_path: Path
) -> None:
    upstream = driver_logits(tokens, UPSTREAM_LIBS, tmp_path)
    np.testing.assert_array_equal(swarmkv_logits(repacked_model, tokens), upstream)
    control = swarmkv_logits(repacked_model, tokens, skinny_gemm=2)
    assert not np.array_equal(control[:3], upstream[:3]), "the skinny GEMM must round otherwise"
