"""A fake llama-server for the unit tests: /health and a streaming /completion shaped like the
pinned server's, served on 127.0.0.1 in a thread (conftest's `fake_server`) or, run as a script,
as a fake binary (conftest's `fake_binary`) that answers --help like llama-server.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_DELAY_S = 0.03
EOG_ID = 1  # the fake's end-of-generation id
HELP_TEXT = "usage: llama-server\n  -m, --model FNAME\n  --port PORT\n  -np, --parallel N\n" + (
    "  -kvu, --kv-unified, -no-kvu, --no-kv-unified\n  --cache-prompt, --no-cache-prompt\n"
    "  --ui, --webui, --no-ui, --no-webui\n  --swa-full\n"
)


def fake_tokens(prompt: str, n: int) -> list[int]:
    """Deterministic 'generated' ids that differ between prompts."""
    return [(len(prompt) * 7 + k) % 1000 for k in range(n)]


class FakeHandler(BaseHTTPRequestHandler):
    """/health and a streaming /completion shaped like the pinned llama-server's.

    Prompts containing FAIL get HTTP 500, ERROR an error event mid-stream, SPLIT a withheld
    id (as for a token ending mid UTF-8 character), EOS end after two ids and the
    end-of-generation id EOG_ID, which the server streams too. A char-level "prompt cache" fills
    prompt_n / cache_n like the server's token-level one.
    """

    protocol_version = "HTTP/1.0"  # the body ends when the connection closes
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        ok = self.path == "/health"
        self._json(200 if ok else 404, {"status": "ok"} if ok else {"error": "no"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"]
        start = time.monotonic()
        if "FAIL" in prompt:
            self._json(500, {"error": {"code": 500, "message": "boom"}})
            return
        with self.server.slots:  # a request waits for a slot, as in the server's queue
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.flush()  # headers first, as the server does when a slot takes it
            self._stream(prompt, body, start)

    def _stream(self, prompt: str, body: dict[str, Any], start: float) -> None:
        cached = self.server.cached(prompt)
        ids = fake_tokens(prompt, body["n_predict"])
        stop_type = "limit"
        if "EOS" in prompt and len(ids) > 3:
            ids, stop_type = [*ids[:2], EOG_ID], "eos"
        for k, tok in enumerate(ids):
            time.sleep(TOKEN_DELAY_S)
            if "ERROR" in prompt and k == 1:
                self._event({"error": {"code": 500, "message": "decode failed"}})
                return
            if "SPLIT" in prompt and k == 0:
                continue  # withheld: the server never streams it
            self._event({"content": "x", "tokens": [tok], "stop": False})
        timings = {"cache_n": cached, "prompt_n": len(prompt) - cached, "prompt_ms": 12.5,
                   "predicted_n": len(ids), "predicted_ms": 40.0}  # fmt: skip
        # Recorded before the closing event, so the client cannot see the end first.
        self.server.record(body, start, time.monotonic())
        self._event(
            {"content": "", "tokens": [], "stop": True, "stop_type": stop_type, "timings": timings}
        )

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b": ping\n\ndata: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int = 0, slots: int = 1000) -> None:
        super().__init__(("127.0.0.1", port), FakeHandler)
        self.slots = threading.Semaphore(slots)
        self.lock = threading.Lock()
        self.requests: list[tuple[dict[str, Any], float, float]] = []
        self.last_prompt = ""

    def cached(self, prompt: str) -> int:
        with self.lock:
            pairs = zip(prompt, self.last_prompt, strict=False)
            n = next((i for i, (a, b) in enumerate(pairs) if a != b), len(self.last_prompt))
            n = min(n, len(prompt))
            self.last_prompt = prompt
            return n

    def record(self, body: dict[str, Any], start: float, end: float) -> None:
        with self.lock:
            self.requests.append((body, start, end))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def serving(slots: int = 1000) -> Iterator[FakeServer]:
    """A FakeServer with `slots` slots answering in a thread for the block."""
    server = FakeServer(slots=slots)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str]) -> None:
    """This file as a fake llama-server binary: --help, or serve on --port (with -np slots)
    until SIGTERM."""
    if "--help" in argv:
        sys.stdout.write(HELP_TEXT)
        return
    print("fake llama-server args:", " ".join(argv), flush=True)
    if "--die" in argv:
        print("fatal: model file is not a GGUF", flush=True)
        sys.exit(3)
    if "--ignore-term" in argv:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    port, slots = (int(argv[argv.index(flag) + 1]) for flag in ("--port", "-np"))
    FakeServer(port, slots).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
