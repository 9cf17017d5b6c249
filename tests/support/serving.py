"""A `swarmkv serve` for tests: the real CLI in a subprocess on a free loopback port, or the
app in this process on uvicorn in a thread, and helpers to wait for it and read its cells."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from swarmkv_bench.peer_server import free_port
from swarmkv_bench.serve_process import ServeProcess, wait_healthy

from .proc import child_env


def tiny_args(model: Path, *extra: str) -> list[str]:
    """`swarmkv serve` flags for a tiny model: a small context, both cores, then extra."""
    return ["-m", str(model), "-c", "2048", "-t", "2", *extra]


@dataclass
class Served:
    """A running server: its base URL (no /v1), its process (or None in-process), its app."""

    base: str
    proc: subprocess.Popen | None = None
    app: Any = None
    log: Path | None = None

    @property
    def v1(self) -> str:
        return self.base + "/v1"

    def status(self, key: str | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(self.v1 + "/status", headers=headers, timeout=10).json()


@contextmanager
def serve_process(args: Sequence[str], tmp: Path, timeout_s: float = 180.0) -> Iterator[Served]:
    """`swarmkv serve ARGS` in a subprocess (the bench's ServeProcess); SIGTERM at the end."""
    server = ServeProcess(
        args, log_path=tmp / "serve.log", env=child_env(), start_timeout_s=timeout_s
    )
    with server:
        yield Served(server.base_url, server.proc, log=server.log_path)


@contextmanager
def serve_in_thread(argv: Sequence[str]) -> Iterator[Served]:
    """The app of `swarmkv serve ARGV` on uvicorn in a thread of this process (its runtime
    reachable as .app.state.runtime); stopped and freed at the end."""
    import uvicorn

    from swarmkv.cli.app import build_parser
    from swarmkv.serve.http.app import create_app
    from swarmkv.serve.http.boot import boot

    args = build_parser().parse_args(["serve", *argv])
    runtime, settings = boot(args)
    app = create_app(runtime, settings)
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, 60)
        yield Served(base, app=app)
    finally:
        server.should_exit = True
        thread.join(30)
        runtime.close()
        runtime.model.close()
