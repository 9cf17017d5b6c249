"""Made-up but plausible trial records, to exercise summaries, plots and the report without a
model (tests, and a dry run of the whole output path). Never quote these numbers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .records import TrialRecord

MODES = ("baseline", "fork", "host", "server-np1")
MS_PER_DOC_TOKEN = 0.05  # made-up prefill speed
MS_PER_GEN_TOKEN = 5.0  # made-up decode speed
KV_BYTES_PER_TOKEN = 18_432


def synthetic_records(
    configs: Sequence[tuple[int, int, int]] = ((2, 3501, 32),),
    modes: Sequence[str] = MODES,
    trials: int = 3,
    warmup: int = 1,
    seed: int = 0,
    mismatch: tuple[str, str, int] | None = None,
) -> list[TrialRecord]:
    """Records for each (n_branches, doc_tokens, n_predict) config, modes alternating per trial.

    `mismatch=(config_id, mode, trial)` marks that one trial as a fidelity failure.
    """
    rng = np.random.default_rng(seed)
    out: list[TrialRecord] = []
    for n, doc, n_predict in configs:
        config_id = f"N{n}-doc{doc}-p{n_predict}"
        for trial in range(warmup + trials):
            for mode in modes:
                jitter = float(rng.uniform(0.95, 1.08)) * (1.3 if trial < warmup else 1.0)
                bad = mismatch == (config_id, mode, trial)
                out.append(
                    _record(config_id, n, doc, n_predict, mode, trial, trial < warmup, jitter, bad)
                )
    return out


def _record(
    config_id: str,
    n: int,
    doc: int,
    n_predict: int,
    mode: str,
    trial: int,
    warm: bool,
    jitter: float,
    bad: bool,
) -> TrialRecord:
    prefill = doc * MS_PER_DOC_TOKEN * jitter
    decode = n_predict * MS_PER_GEN_TOKEN * jitter
    base, server, fork = mode == "baseline", mode.startswith("server"), mode == "fork"
    restore = None if base or server else (0.2 if fork else 0.004 * doc) * jitter
    act = [
        prefill + 10.0 if base or server else (restore or 0.0) + 10.0 + 2.0 * i for i in range(n)
    ]
    ends = [
        (i + 1) * (prefill + decode) if base or server else prefill + decode * 1.2 for i in range(n)
    ]
    first = [e - decode + 10.0 for e in ends]
    fidelity = None if base or server else not bad
    return TrialRecord(
        config_id=config_id,
        n_branches=n,
        doc_tokens=doc,
        n_predict=n_predict,
        mode=mode,
        trial=trial,
        is_warmup=warm,
        e2e_ms=max(ends) * (1.1 if server else 1.0),
        prefill_ms=None if server else prefill,
        snapshot_bytes=None if base or server else doc * KV_BYTES_PER_TOKEN,
        kv_bytes=None if server else doc * KV_BYTES_PER_TOKEN * (n if base or not fork else 1),
        peak_rss_bytes=None if server else int((300 + 20 * n) * 2**20 * jitter),
        activation_ms=tuple(act),
        first_token_ms=tuple(first),
        restore_ms=(restore,) * n,
        decode_ms=(decode,) * n,
        tokens_generated=n * n_predict,
        fidelity_ok=fidelity,
        fidelity_detail="synthetic: tokens differ at step 3, NOT a near-tie" if bad else "",
        branch_names=tuple(f"b{i + 1}" for i in range(n)),
        end_ms=tuple(ends),
        branch_prefill_ms=(prefill,) * n if base else (None,) * n,
    )
