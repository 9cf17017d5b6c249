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
import http.client
import json
import logging
import math
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal
from urllib.parse import urlsplit

from swarmkv.bench.records import FidelityCheck, TrialRecord
from swarmkv.errors import SwarmKVError
from swarmkv.fidelity import compare

log = logging.getLogger("swarmkv.bench.peer")

Setup = Literal["np1", "npN"]
ENV_SERVER = "SWARMKV_LLAMA_SERVER"
SERVER_RELPATH = Path("build/llama-server/bin/llama-server")
HOST = "127.0.0.1"  # the peer is a local benchmark subject: never listen beyond loopback
CTX_MARGIN = 32  # tokens per slot beyond prompt + n_predict: the server stops at n_ctx - 1
CTX_PAD = 256  # llama_context pads n_ctx (and n_ctx per sequence) to a multiple of 256
FLASH_ATTN = ("on", "off", "auto")
_SETUPS = ("np1", "npN")


class PeerError(SwarmKVError):
    """The llama-server peer could not be run."""


class PeerServerError(PeerError):
    """llama-server did not start, or its --help could not be read."""


class PeerRequestError(PeerError):
    """One completion request failed (HTTP status, error event, bad stream)."""


# ----------------------------------------------------------------------------- binary


def find_llama_server(repo_root: Path | None = None) -> Path | None:
    """The llama-server binary: $SWARMKV_LLAMA_SERVER, else build/llama-server/bin/llama-server.

    Without `repo_root`, the current directory and the source tree this module lives in are
    tried (the latter only helps when running from a checkout). None when nothing is built.
    """
    override = os.environ.get(ENV_SERVER)
    if override:
        path = Path(override).expanduser()
        if _is_executable(path):
            return path
        # An explicit choice that does not exist must not silently become another binary.
        log.warning("%s=%s is not an executable file", ENV_SERVER, override)
        return None
    roots = [repo_root] if repo_root is not None else [Path.cwd(), Path(__file__).parents[2]]
    for root in roots:
        candidate = root / SERVER_RELPATH
        if _is_executable(candidate):
            return candidate
    return None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


@lru_cache(maxsize=8)
def server_options(binary: Path) -> frozenset[str]:
    """Every option name `binary --help` lists, so optional flags are only passed if known."""
    try:
        proc = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerServerError(f"cannot run {binary} --help: {exc}") from exc
    text = proc.stdout + proc.stderr
    if proc.returncode != 0 or "--port" not in text:
        raise PeerServerError(f"{binary} --help failed (status {proc.returncode}): {text[-500:]}")
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class ServerConfig:
    """The llama-server knobs the benchmark sets; the rest stay at the server's defaults."""

    model_path: Path
    n_ctx: int
    n_parallel: int = 1
    threads: int = 1
    n_batch: int = 512
    kv_unified: bool = False
    swa_full: bool = False
    flash_attn: str = "auto"
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n_ctx < 1 or self.n_parallel < 1 or self.threads < 1 or self.n_batch < 1:
            raise ValueError(f"n_ctx, n_parallel, threads and n_batch must be >= 1: {self}")
        if self.flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be one of {FLASH_ATTN}, got {self.flash_attn!r}")


def build_command(
    binary: Path, config: ServerConfig, port: int, options: frozenset[str] = frozenset()
) -> list[str]:
    """The command line; `options` (from `server_options`) gates flags older servers lack."""
    n_batch = str(config.n_batch)
    cmd = [str(binary), "-m", str(config.model_path), "--host", HOST, "--port", str(port)]
    cmd += ["-c", str(config.n_ctx), "-np", str(config.n_parallel)]
    cmd += ["-t", str(config.threads), "-tb", str(config.threads)]
    # -ub too: SwarmKV's contexts use n_ubatch = n_batch, and the batch shapes must match.
    cmd += ["-b", n_batch, "-ub", n_batch, "-fa", config.flash_attn]
    if config.kv_unified:
        cmd.append("--kv-unified")
    elif "--no-kv-unified" in options:
        cmd.append("--no-kv-unified")  # explicit: the default depends on how -np was given
    if config.swa_full:
        cmd.append("--swa-full")
    for flag in ("--cache-prompt", "--no-webui"):  # prompt cache on (the default) and no UI
        if flag in options:
            cmd.append(flag)
    return cmd + list(config.extra_args)


def size_n_ctx(
    prompt_tokens: int,
    n_predict: int,
    n_parallel: int = 1,
    *,
    kv_unified: bool = False,
    margin: int = CTX_MARGIN,
) -> int:
    """The `-c` that lets every slot hold its longest prompt + n_predict (+ margin).

    Without --kv-unified the server splits -c evenly over the slots, each padded to 256; with
    it the slots share one buffer, so it must hold all of them at once.
    """
    if prompt_tokens < 1 or n_predict < 0 or n_parallel < 1:
        raise ValueError("need prompt_tokens >= 1, n_predict >= 0 and n_parallel >= 1")
    per_slot = prompt_tokens + n_predict + margin
    if kv_unified:
        return _pad(per_slot * n_parallel)
    return _pad(per_slot) * n_parallel


def _pad(n: int) -> int:
    return -(-n // CTX_PAD) * CTX_PAD


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@lru_cache(maxsize=16)
def count_tokens(model_path: Path, texts: tuple[str, ...]) -> tuple[int, ...]:
    """Token counts (with BOS) from SwarmKV's own tokenizer: the same vocab code as the server."""
    from swarmkv.llama import Model  # lazy: only sizing without explicit n_ctx needs it

    with Model(model_path) as model:
        return tuple(len(model.tokenize(text)) for text in texts)


# ----------------------------------------------------------------------------- HTTP client


@dataclass
class BranchRun:
    """What one branch's request produced; times are time.perf_counter_ns() values."""

    index: int
    sent_ns: int | None = None
    first_ns: int | None = None
    last_ns: int | None = None
    tokens: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def withheld(self) -> int:
        """Generated ids the stream never carried (tokens ending mid UTF-8 character)."""
        predicted = self.timings.get("predicted_n")
        return max(0, int(predicted) - len(self.tokens)) if predicted is not None else 0


def completion_payload(prompt: str, n_predict: int) -> dict[str, Any]:
    """A /completion request for greedy decoding with streamed token ids (see module doc)."""
    return {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0.0,
        "top_k": 1,
        "samplers": ["top_k"],
        "cache_prompt": True,
        "stream": True,
        "return_tokens": True,
    }


def iter_sse_events(readline: Callable[[], bytes]) -> Iterator[dict[str, Any]]:
    """JSON payloads of a server-sent-event stream, one per event, until EOF or ``[DONE]``.

    Comment lines (``:`` pings) and ``event:``/``id:`` fields are skipped; several ``data:``
    lines of one event are joined with newlines, as the SSE standard says.
    """
    data: list[str] = []
    while True:
        raw = readline()
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                text, data = "\n".join(data), []
                if text.strip() == "[DONE]":
                    return
                yield json.loads(text)
            if not raw:  # EOF
                return
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)


class PeerClient:
    """HTTP client of one llama-server (or anything speaking its /health and /completion)."""

    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self.base_url = base_url
        self.host: str = parts.hostname
        self.port: int = parts.port
        self.timeout_s = timeout_s

    def _connection(self, timeout_s: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout_s or self.timeout_s)

    def health(self) -> bool:
        """True once the server answers GET /health with 200 (503 while loading)."""
        conn = self._connection(timeout_s=5.0)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            return resp.status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def stream_completion(self, payload: Mapping[str, Any], run: BranchRun) -> None:
        """POST /completion with stream on; fills `run` with event times, ids and timings.

        `run.sent_ns` is taken just before the request goes out. Bounded: every socket read
        waits at most timeout_s, and the whole request may take at most timeout_s as well.
        """
        body = json.dumps(payload).encode("utf-8")
        deadline = time.monotonic() + self.timeout_s
        conn = self._connection()
        try:
            run.sent_ns = time.perf_counter_ns()
            conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise PeerRequestError(f"HTTP {resp.status}: {resp.read(2000)!r}")
            for event in iter_sse_events(resp.readline):
                _absorb(run, event, time.perf_counter_ns())
                if event.get("stop") is True:
                    break
                if time.monotonic() > deadline:
                    raise PeerRequestError(f"no end of stream after {self.timeout_s:.0f} s")
        finally:
            conn.close()


def _absorb(run: BranchRun, event: Mapping[str, Any], now_ns: int) -> None:
    if "error" in event:
        raise PeerRequestError(f"server error event: {event['error']}")
    ids = event.get("tokens") or []
    if ids:
        run.first_ns = run.first_ns if run.first_ns is not None else now_ns
        run.last_ns = now_ns
        run.tokens.extend(int(t) for t in ids)
    timings = event.get("timings")
    if isinstance(timings, dict):
        run.timings = {k: float(v) for k, v in timings.items() if isinstance(v, int | float)}


def _attempt(client: PeerClient, payload: Mapping[str, Any], run: BranchRun) -> None:
    """One branch's request; a failure is kept on the run (see the failure policy)."""
    try:
        client.stream_completion(payload, run)
    except (PeerRequestError, OSError, http.client.HTTPException, ValueError) as exc:
        run.error = f"{type(exc).__name__}: {exc}"
        log.warning("llama-server request for branch %d failed: %s", run.index, run.error)


def _run_sequential(
    client: PeerClient, payloads: Sequence[Mapping[str, Any]]
) -> tuple[int, list[BranchRun]]:
    """np1: one request at a time, so the slot's cache holds the document for branches 2..N."""
    runs = [BranchRun(i) for i in range(len(payloads))]
    t0 = time.perf_counter_ns()
    for run, payload in zip(runs, payloads, strict=True):
        _attempt(client, payload, run)
    return t0, runs


def _run_concurrent(
    client: PeerClient, payloads: Sequence[Mapping[str, Any]]
) -> tuple[int, list[BranchRun]]:
    """npN: every request at once; threads start first and wait, so t0 is the release."""
    runs = [BranchRun(i) for i in range(len(payloads))]
    go = threading.Event()

    def work(run: BranchRun, payload: Mapping[str, Any]) -> None:
        go.wait()
        _attempt(client, payload, run)

    threads = [
        threading.Thread(target=work, args=(r, p), name=f"peer-b{r.index}", daemon=True)
        for r, p in zip(runs, payloads, strict=True)
    ]
    for thread in threads:
        thread.start()
    t0 = time.perf_counter_ns()
    go.set()
    for thread in threads:
        thread.join()
    return t0, runs


# ----------------------------------------------------------------------------- records


def _ms(start_ns: int | None, end_ns: int | None) -> float:
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
        fid = compare(run.tokens, base)
        ok = ok and fid.tokens_equal
        notes.append(
            f"{name}: {_describe_tokens(run.tokens, base, fid.n_compared, fid.diverged_at)}"
        )
    if baseline_tokens is None and ok is None:
        return FidelityCheck(None, "not checked: no baseline")
    return FidelityCheck(ok, "; ".join(notes))


def _describe_tokens(
    tokens: Sequence[int], base: Sequence[int], n: int, diverged_at: int | None
) -> str:
    if diverged_at is None:
        return f"{n} tokens equal"
    got = tokens[diverged_at] if diverged_at < len(tokens) else "end"
    want = base[diverged_at] if diverged_at < len(base) else "end"
    # No step logits from the server, so no near-tie test: every divergence counts.
    return (
        f"diverged at step {diverged_at} of {n} (server {got}, baseline {want}; "
        "token ids only, counted as a mismatch)"
    )


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
    evaluated = [run.timings["prompt_n"] for run in runs if "prompt_n" in run.timings]
    if evaluated:
        extra["prompt_tokens_evaluated"] = float(sum(evaluated))
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
    end = tuple(_ms(t0_ns, r.last_ns) for r in runs)
    starts = [r.sent_ns if setup == "np1" else t0_ns for r in runs]
    prompt_ms = [r.timings.get("prompt_ms") for r in runs]
    known = [v for v in prompt_ms if v is not None]
    complete = all(r.error is None for r in runs) and all(math.isfinite(v) for v in end)
    return {
        "e2e_ms": max(end) if complete and end else math.nan,
        "prefill_ms": prompt_ms[0] if setup == "np1" else (max(known) if known else None),
        "activation_ms": tuple(_ms(s, r.first_ns) for s, r in zip(starts, runs, strict=True)),
        "first_token_ms": tuple(_ms(t0_ns, r.first_ns) for r in runs),
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
    if setup not in _SETUPS:
        raise ValueError(f"setup must be one of {_SETUPS}, got {setup!r}")
    if len(branch_names) != len(prompts) or not prompts:
        raise ValueError("need one branch name per prompt, and at least one prompt")
    client = PeerClient(base_url, timeout_s)
    payloads = [completion_payload(doc + p, n_predict) for p in prompts]
    runner = _run_sequential if setup == "np1" else _run_concurrent
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
    config_id: str,
    trial: int,
    is_warmup: bool,
    baseline_tokens: dict[str, list[int]] | None,
    branch_names: list[str],
    n_ctx: int | None = None,
    doc_tokens: int | None = None,
    timeout_s: float = 600.0,
    log_path: Path | None = None,
) -> TrialRecord:
    """Start a llama-server for `setup`, run one trial on it, stop it, return the record.

    Server start-up (model load, warm-up, until /health says 200) is excluded from e2e_ms and
    recorded as extra["server_start_ms"]. Without `n_ctx`, -c is sized with `size_n_ctx` from
    token counts of SwarmKV's tokenizer; `doc_tokens` (document with BOS) likewise.
    """
    n_parallel = 1 if setup == "np1" else len(prompts)
    n_ctx, doc_tokens = _sizes(Path(model_path), doc, prompts, n_predict, setup, n_ctx, doc_tokens)
    config = ServerConfig(
        Path(model_path), n_ctx, n_parallel, threads, n_batch, setup == "npN", swa_full, flash_attn
    )
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
    model_path: Path,
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
    counts = count_tokens(model_path, (doc, *(doc + p for p in prompts)))
    n_parallel = 1 if setup == "np1" else len(prompts)
    if n_ctx is None:
        n_ctx = size_n_ctx(max(counts[1:]), n_predict, n_parallel, kv_unified=setup == "npN")
    return n_ctx, counts[0] if doc_tokens is None else doc_tokens


# ----------------------------------------------------------------------------- process


def read_peak_rss(pid: int) -> int | None:
    """VmHWM (peak resident set) of a live process, in bytes; None when unreadable."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmHWM:\s+(\d+)\s+kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(log unreadable: {exc})"


def _temp_log() -> Path:
    fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
    os.close(fd)  # reopened by LlamaServer for the child's output
    return Path(name)


def _child_env() -> dict[str, str]:
    # llama-server reads LLAMA_ARG_* variables as defaults for its options; the command line
    # must be the whole configuration, so none may leak in from the caller's environment.
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}


class LlamaServer:
    """A llama-server process on 127.0.0.1, healthy inside the `with` block, stopped after.

    stdout and stderr go to `log_path` (default: a temporary file, removed after a clean run
    and kept, with its path in the error, when start-up fails). Stopping sends SIGTERM to the
    server's pid, waits, then SIGKILL: the process never outlives the block.
    """

    def __init__(
        self,
        binary: Path,
        config: ServerConfig,
        *,
        log_path: Path | None = None,
        start_timeout_s: float = 300.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.binary = Path(binary)
        self.config = config
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._own_log = log_path is None
        self.log_path = log_path or _temp_log()
        self.port: int | None = None
        self.start_ms = math.nan
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._failed = False

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise PeerServerError("llama-server is not started")
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Launch and wait for /health == 200; on any failure the process is stopped first."""
        t0 = time.perf_counter_ns()
        try:
            pid = self._launch()
            self._wait_healthy()
        except BaseException:
            self._failed = True
            self.stop()
            raise
        self.start_ms = (time.perf_counter_ns() - t0) / 1e6
        log.info("llama-server pid %d healthy after %.1f ms", pid, self.start_ms)

    def _launch(self) -> int:
        self.port = free_port()
        cmd = build_command(self.binary, self.config, self.port, server_options(self.binary))
        log.info("starting llama-server: %s", " ".join(cmd))
        self._log_file = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
            env=_child_env(),
        )  # fmt: skip
        return self._proc.pid

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        client = PeerClient(self.base_url, timeout_s=5.0)
        deadline = time.monotonic() + self.start_timeout_s
        while not client.health():
            status = self._proc.poll()
            if status is not None:
                raise PeerServerError(
                    f"llama-server exited with status {status} during start-up; "
                    f"log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise PeerServerError(
                    f"llama-server not healthy after {self.start_timeout_s:.0f} s; "
                    f"log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(0.05)

    def peak_rss_bytes(self) -> int | None:
        """The server's peak RSS so far (VmHWM); None once it has exited."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return read_peak_rss(self._proc.pid)

    def stop(self) -> None:
        """SIGTERM by pid, wait, then SIGKILL. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() not in (None, 0):
            # It died on its own: keep the log, it is the only account of why.
            self._failed = True
            log.error("llama-server pid %d had exited with status %s; log %s",
                      proc.pid, proc.returncode, self.log_path)  # fmt: skip
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("llama-server pid %d ignored SIGTERM; killing it", proc.pid)
                proc.kill()
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._own_log and not self._failed:
            self.log_path.unlink(missing_ok=True)
