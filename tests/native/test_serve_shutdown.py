"""`swarmkv serve` stops the way a service manager expects: SIGTERM (or Ctrl-C) stops
accepting, lets in-flight requests finish within --grace, cancels the rest, and exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from support.serving import serve_process, tiny_args

DOC = "A long answer is still being written when the server is told to stop. " * 4


def _stream(v1: str, max_tokens: int, out: dict, started: threading.Event) -> None:
    body = {"prompt": DOC, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    events = []
    try:
        with httpx.stream("POST", v1 + "/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
    out["events"] = events
    started.set()


def _streaming(v1: str, max_tokens: int) -> tuple[threading.Thread, dict]:
    """A streaming request on its own thread, returned once its first event has arrived."""
    out: dict = {}
    started = threading.Event()
    t = threading.Thread(target=_stream, args=(v1, max_tokens, out, started))
    t.start()
    assert started.wait(60)
    return t, out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_drains_in_flight_requests_and_exits_0(
    tiny_model_path: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    args = tiny_args(tiny_model_path, "--grace", "120")
    with serve_process(args, tmp_path) as s:
        t, out = _streaming(s.v1, 300)
        assert s.proc is not None
        s.proc.send_signal(sig)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):  # no longer accepting
            httpx.get(s.base + "/health", timeout=5)
        t.join(150)
        assert s.proc.wait(150) == 0, s.log.read_text() if s.log else ""
    events = out["events"]
    assert events[-1] == "[DONE]", out
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length"


def test_grace_over_cancels_what_is_left_and_still_exits_0(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    args = tiny_args(tiny_model_path, "--grace", "0.3", "--max-live", "1")
    with serve_process(args, tmp_path) as s:
        t, out = _streaming(s.v1, 1900)
        t0 = time.monotonic()
        assert s.proc is not None
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0
        took = time.monotonic() - t0
        t.join(60)
    assert took < 30
    assert "[DONE]" not in out.get("events", [])  # cut off, not finished
