"""The HTTP side of the peer: `PeerClient` streams completions from any llama-server base URL
(a fake one in the tests) and records when each token arrived. See peer.py.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from swarmkv.errors import ConfigError

from .peer_server import PeerRequestError, log

# ----------------------------------------------------------------------------- HTTP client


@dataclass
class BranchRun:
    """What one branch's request produced; times are time.perf_counter_ns() values.

    started_ns: the response headers arrived, which the server sends when a slot takes the
    request (it starts on the prompt), so started_ns - sent_ns is the wait in its queue.
    stamps_ns: one arrival time per streamed id; text: the streamed content; stop_type: the
    closing event's ("eos", "limit", "word", "none").
    """

    index: int
    sent_ns: int | None = None
    first_ns: int | None = None
    last_ns: int | None = None
    tokens: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    started_ns: int | None = None
    stamps_ns: list[int] = field(default_factory=list)
    text: str = ""
    stop_type: str | None = None

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
            raise ConfigError(f"expected http://host:port, got {base_url!r}")
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

    def post_json(self, path: str, body: Mapping[str, Any]) -> Any:
        """POST body as JSON to path; the answer's JSON, or PeerRequestError naming the
        status and the server's message."""
        conn = self._connection()
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise PeerRequestError(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if resp.status != 200:
            raise PeerRequestError(f"POST {path}: {resp.status} {raw[:300]!r}")
        return json.loads(raw)

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
            run.started_ns = time.perf_counter_ns()
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
        run.stamps_ns.extend(now_ns for _ in ids)
    run.text += str(event.get("content") or "")
    if event.get("stop") is True:
        run.stop_type = str(event.get("stop_type", "none"))
    timings = event.get("timings")
    if isinstance(timings, dict):
        run.timings = {k: float(v) for k, v in timings.items() if isinstance(v, int | float)}


def attempt(client: PeerClient, payload: Mapping[str, Any], run: BranchRun) -> None:
    """One branch's request; a failure is kept on the run (see the failure policy)."""
    try:
        client.stream_completion(payload, run)
    except (PeerRequestError, OSError, http.client.HTTPException, ValueError) as exc:
        run.error = f"{type(exc).__name__}: {exc}"
        log.warning("llama-server request for branch %d failed: %s", run.index, run.error)


def run_sequential(
    client: PeerClient, payloads: Sequence[Mapping[str, Any]]
) -> tuple[int, list[BranchRun]]:
    """np1: one request at a time, so the slot's cache holds the document for branches 2..N."""
    runs = [BranchRun(i) for i in range(len(payloads))]
    t0 = time.perf_counter_ns()
    for run, payload in zip(runs, payloads, strict=True):
        attempt(client, payload, run)
    return t0, runs


def run_concurrent(
    client: PeerClient, payloads: Sequence[Mapping[str, Any]]
) -> tuple[int, list[BranchRun]]:
    """npN: every request at once; threads start first and wait, so t0 is the release."""
    runs = [BranchRun(i) for i in range(len(payloads))]
    go = threading.Event()

    def work(run: BranchRun, payload: Mapping[str, Any]) -> None:
        go.wait()
        attempt(client, payload, run)

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
