"""llama.cpp's own llama-server as the benchmark's peer: the same workload on the same tree.

The first question about SwarmKV is "why not llama-server with its prompt cache?". This module
runs the benchmark's workload (one shared document, N branch prompts, greedy decoding) on
llama-server built from the same vendored, patched llama.cpp (bench/build_llama_server.sh), in
two setups:

- ``np1``: one slot (``-np 1``); the branches go one after another with ``cache_prompt``, so
  branches 2..N reuse the document already in the slot's KV cache: the server's best sequential
  case. The first request pays the document prefill; its ``prompt_ms`` is the record's prefill.
- ``npN``: N slots sharing one KV buffer (``-np N --kv-unified``); all branches are sent at once
  and decoded with continuous batching. Every slot prefills the document itself.

Layers, so that everything but the process can be tested against a fake server: `PeerClient`
speaks HTTP to any base URL; `run_peer_trial_at` runs one trial against a running server;
`build_peer_record` turns timestamps into a `TrialRecord`; `LlamaServer` owns the process;
`run_peer_trial` ties them together.

What the pinned server (tools/server of vendor/llama.cpp, commit 0c1e570) does, and this relies on:

- Greedy decoding: ``"samplers": ["top_k"], "top_k": 1`` leaves one candidate for the chain's
  final ``dist`` sampler. Only listed samplers run, so no penalties, DRY, top-p or temperature
  (``temperature: 0`` is sent as well, but is then not part of the chain).
- Token ids: in stream mode every SSE event carries ``tokens`` (one id), ``return_tokens`` or
  not; the closing event (``stop: true``) carries ``timings`` and no tokens. A token that ends
  mid UTF-8 character is NOT streamed (the server waits for the character to complete and sends
  only the completing id), so its id never reaches the client. Such gaps are counted from
  ``timings.predicted_n`` and reported as a fidelity failure, never guessed.
- Prompt: one string, ``document + prompt``, tokenized by the server with BOS. SwarmKV tokenizes
  the two separately, so per measuring.md only token equality applies, and a
  mismatch is reported, not hidden.
- ``-c`` is the total KV size: without ``--kv-unified`` each of the N slots gets n_ctx / N
  (padded to 256); with it every slot may use all of n_ctx, which the slots share.
- ``/health`` answers 503 while the model loads and warms up, 200 when ready. A streamed
  completion opens with headers only when its prompt processing starts; the first ``data:``
  event is the first generated token.

Failure policy: a server that does not start raises `PeerServerError`. A request that fails
(HTTP error, error event, timeout, lost connection) does not raise: its branch keeps NaN times,
the record's ``e2e_ms`` is NaN, ``fidelity_ok`` is False and ``fidelity_detail`` says why, so a
bench run keeps every trial and the failure shows in its outputs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from swarmkv.errors import ConfigError
from swarmkv.pipeline.fidelity import compare

from .peer_client import (
    BranchRun,
    PeerClient,
    completion_payload,
    iter_sse_events,
    run_concurrent,
    run_sequential,
)
from .peer_server import (
    ENV_SERVER,
    SETUPS,
    LlamaServer,
    PeerError,
    PeerRequestError,
    PeerServerError,
    ServerConfig,
    Setup,
    Tokenizer,
    build_command,
    count_tokens,
    find_llama_server,
    free_port,
    read_peak_rss,
    size_n_ctx,
)
from .peer_server import log as log
from .records import FidelityCheck, TrialRecord

__all__ = [
    "ENV_SERVER",
    "BranchRun",
    "LlamaServer",
    "PeerClient",
    "PeerError",
    "PeerRequestError",
    "PeerServerError",
    "ServerConfig",
    "Setup",
    "build_command",
    "build_peer_record",
    "completion_payload",
    "count_tokens",
    "find_llama_server",
    "free_port",
    "iter_sse_events",
    "read_peak_rss",
    "run_peer_trial",
    "run_peer_trial_at",
    "size_n_ctx",
]


# ----------------------------------------------------------------------------- records


def ms_between(start_ns: int | None, end_ns: int | None) -> float:
    """Milliseconds from start_ns to end_ns; NaN when either is unknown."""
    if start_ns is None or end_ns is None:
        return math.nan
    return (end_ns - start_ns) / 1e6


def peer_fidelity(
    runs: Sequence[BranchRun],
    branch_names: Sequence[str],
    baseline_tokens: Mapping[str, Sequence[int]] | None,
) -> FidelityCheck:
    """Token equality per branch (no logits: the server returns none).

    A failed request or withheld ids make the check fail even without a baseline: equality
    cannot be shown, and that must be visible rather than read as "not checked".
    """
    notes: list[str] = []
    ok: bool | None = None if baseline_tokens is None else True
    for run, name in zip(runs, branch_names, strict=True):
        if run.error is not None:
            ok = False
            notes.append(f"{name}: request failed: {run.error}")
            continue
        if run.withheld:
            ok = False
            notes.append(
                f"{name}: stream carried {len(run.tokens)} of {len(run.tokens) + run.withheld} "
                "token ids (ids of tokens ending mid UTF-8 character are not streamed)"
            )
        if baseline_tokens is None:
            continue
        base = baseline_tokens.get(name)
        if base is None:
            ok = False
            notes.append(f"{name}: no baseline")
            continue
        fid = compare(run.tokens, base)  # no step logits from a server: ids only
        ok = ok and fid.tokens_equal
        notes.append(f"{name}: {fid.describe()}")
    if baseline_tokens is None and ok is None:
        return FidelityCheck(None, "not checked: no baseline")
    return FidelityCheck(ok, "; ".join(notes))


# server `timings` key -> extra key (suffixed _b{i}): what each request really evaluated
_TIMING_EXTRAS = (
    ("prompt_n", "prompt_tokens_evaluated"),
    ("cache_n", "prompt_tokens_cached"),
    ("prompt_ms", "prompt_ms"),
)


def _peer_extra(runs: Sequence[BranchRun]) -> dict[str, float]:
    """Per-branch server timings: how much of each prompt the server really evaluated."""
    extra: dict[str, float] = {}
    for run in runs:
        for key, name in _TIMING_EXTRAS:
            if key in run.timings:
                extra[f"{name}_b{run.index}"] = run.timings[key]
    return extra | peer_totals(runs)


def peer_totals(runs: Sequence[BranchRun]) -> dict[str, float]:
    """Over all requests: prompt tokens the server evaluated and took from its cache (sums
    of its prompt_n and cache_n, where reported), token ids withheld, failed requests."""
    extra: dict[str, float] = {}
    for key, name in _TIMING_EXTRAS[:2]:
        known = [run.timings[key] for run in runs if key in run.timings]
        if known:
            extra[name] = float(sum(known))
    extra["token_ids_withheld"] = float(sum(run.withheld for run in runs))
    extra["failed_branches"] = float(sum(run.error is not None for run in runs))
    return extra


def build_peer_record(
    runs: Sequence[BranchRun],
    t0_ns: int,
    *,
    setup: Setup,
    config_id: str,
    trial: int,
    is_warmup: bool,
    n_predict: int,
    doc_tokens: int,
    branch_names: Sequence[str],
    baseline_tokens: Mapping[str, Sequence[int]] | None,
    extra: Mapping[str, float] | None = None,
) -> TrialRecord:
    """The trial's record. Times are relative to `t0_ns` (the trial start).

    activation_ms[i]: np1 from branch i's request going out, npN from the trial start, to its
    first token. prefill_ms: np1 the first request's server ``prompt_ms`` (the document
    prefill); npN the largest ``prompt_ms`` (the slots prefill concurrently in shared batches,
    so their times overlap and are not summed: branch_prefill_ms stays empty for npN).
    e2e_ms: to the last token of the last branch; NaN when any request failed.
    extra: per branch (suffix _b{i}, i the 0-based branch position) the server's prompt_n as
    prompt_tokens_evaluated, cache_n as prompt_tokens_cached, and prompt_ms; their
    prompt_tokens_evaluated sum; token_ids_withheld; failed_branches.
    """
    fid = peer_fidelity(runs, branch_names, baseline_tokens)
    if fid.ok is False:
        log.warning("llama-server %s %s trial %d: %s", setup, config_id, trial, fid.detail)
    return TrialRecord(
        config_id=config_id,
        n_branches=len(runs),
        doc_tokens=doc_tokens,
        n_predict=n_predict,
        mode=f"server-{setup}",
        trial=trial,
        is_warmup=is_warmup,
        tokens_generated=sum(len(r.tokens) + r.withheld for r in runs),
        fidelity_ok=fid.ok,
        fidelity_detail=fid.detail,
        extra=_peer_extra(runs) | dict(extra or {}),
        branch_names=tuple(branch_names),
        **_timing_fields(runs, t0_ns, setup),
    )


def _timing_fields(runs: Sequence[BranchRun], t0_ns: int, setup: Setup) -> dict[str, Any]:
    """The record's time fields (see build_peer_record for their definitions)."""
    end = tuple(ms_between(t0_ns, r.last_ns) for r in runs)
    starts = [r.sent_ns if setup == "np1" else t0_ns for r in runs]
    prompt_ms = [r.timings.get("prompt_ms") for r in runs]
    known = [v for v in prompt_ms if v is not None]
    complete = all(r.error is None for r in runs) and all(math.isfinite(v) for v in end)
    return {
        "e2e_ms": max(end) if complete and end else math.nan,
        "prefill_ms": prompt_ms[0] if setup == "np1" else (max(known) if known else None),
        "activation_ms": tuple(
            ms_between(s, r.first_ns) for s, r in zip(starts, runs, strict=True)
        ),
        "first_token_ms": tuple(ms_between(t0_ns, r.first_ns) for r in runs),
        "end_ms": end,
        "decode_ms": tuple(r.timings.get("predicted_ms", math.nan) for r in runs),
        "branch_prefill_ms": tuple(prompt_ms) if setup == "np1" else (),
    }


# ----------------------------------------------------------------------------- trials


def run_peer_trial_at(
    base_url: str,
    *,
    doc: str,
    prompts: Sequence[str],
    n_predict: int,
    setup: Setup,
    config_id: str,
    trial: int,
    is_warmup: bool,
    baseline_tokens: Mapping[str, Sequence[int]] | None,
    branch_names: Sequence[str],
    doc_tokens: int,
    timeout_s: float = 600.0,
) -> TrialRecord:
    """One trial against a server that is already healthy at `base_url`.

    The trial starts when the first request is released (np1) or all are (npN); whatever
    happened before, server start-up included, is outside e2e_ms.
    """
    if setup not in SETUPS:
        raise ConfigError(f"setup must be one of {SETUPS}, got {setup!r}")
    if len(branch_names) != len(prompts) or not prompts:
        raise ConfigError("need one branch name per prompt, and at least one prompt")
    client = PeerClient(base_url, timeout_s)
    payloads = [completion_payload(doc + p, n_predict) for p in prompts]
    runner = run_sequential if setup == "np1" else run_concurrent
    t0_ns, runs = runner(client, payloads)
    return build_peer_record(
        runs,
        t0_ns,
        setup=setup,
        config_id=config_id,
        trial=trial,
        is_warmup=is_warmup,
        n_predict=n_predict,
        doc_tokens=doc_tokens,
        branch_names=branch_names,
        baseline_tokens=baseline_tokens,
    )


def run_peer_trial(
    server_bin: Path,
    model_path: Path,
    *,
    doc: str,
    prompts: list[str],
    n_predict: int,
    threads: int,
    setup: Setup,
    swa_full: bool,
    flash_attn: str,
    n_batch: int,
    batch_invariant: bool = False,
    config_id: str,
    trial: int,
    is_warmup: bool,
    baseline_tokens: dict[str, list[int]] | None,
    branch_names: list[str],
    n_ctx: int | None = None,
    doc_tokens: int | None = None,
    timeout_s: float = 600.0,
    log_path: Path | None = None,
    tokenizer: Tokenizer | None = None,
) -> TrialRecord:
    """Start a llama-server for `setup`, run one trial on it, stop it, return the record.

    Server start-up (model load, warm-up, until /health says 200) is excluded from e2e_ms and
    recorded as extra["server_start_ms"]. Without `n_ctx`, -c is sized with `size_n_ctx` from
    token counts of `tokenizer` (the swarmkv.Model the caller holds); `doc_tokens` (document
    with BOS) likewise. batch_invariant: the server runs the batch-invariant kernels
    (LLAMA_BATCH_INVARIANT=1, weights not repacked), like SwarmKV's +inv modes.
    """
    n_parallel = 1 if setup == "np1" else len(prompts)
    n_ctx, doc_tokens = _sizes(tokenizer, doc, prompts, n_predict, setup, n_ctx, doc_tokens)
    config = ServerConfig(
        Path(model_path), n_ctx, n_parallel, threads, n_batch, setup == "npN", swa_full, flash_attn,
        batch_invariant=batch_invariant,
    )  # fmt: skip
    with LlamaServer(server_bin, config, log_path=log_path) as server:
        record = run_peer_trial_at(
            server.base_url, doc=doc, prompts=prompts, n_predict=n_predict, setup=setup,
            config_id=config_id, trial=trial, is_warmup=is_warmup,
            baseline_tokens=baseline_tokens, branch_names=branch_names, doc_tokens=doc_tokens,
            timeout_s=timeout_s,
        )  # fmt: skip
        peak = server.peak_rss_bytes()
        more = {"server_start_ms": server.start_ms, "n_ctx": float(n_ctx)}
    return dataclasses.replace(record, peak_rss_bytes=peak, extra=record.extra | more)


def _sizes(
    tokenizer: Tokenizer | None,
    doc: str,
    prompts: Sequence[str],
    n_predict: int,
    setup: Setup,
    n_ctx: int | None,
    doc_tokens: int | None,
) -> tuple[int, int]:
    """(n_ctx, doc_tokens): the given values, else sized from SwarmKV's token counts."""
    if n_ctx is not None and doc_tokens is not None:
        return n_ctx, doc_tokens
    if tokenizer is None:
        raise ConfigError("run_peer_trial: give n_ctx and doc_tokens, or a tokenizer to size them")
    counts = count_tokens(tokenizer, (doc, *(doc + p for p in prompts)))
    n_parallel = 1 if setup == "np1" else len(prompts)
    if n_ctx is None:
        n_ctx = size_n_ctx(max(counts[1:]), n_predict, n_parallel, kv_unified=setup == "npN")
    return n_ctx, counts[0] if doc_tokens is None else doc_tokens
