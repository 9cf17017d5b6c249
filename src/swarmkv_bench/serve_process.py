"""`swarmkv serve` as a benchmark subject (and the tests' server): a subprocess on a free
127.0.0.1 port, healthy inside the `with` block, stopped with SIGTERM after (SIGKILL if it
does not exit), like peer_server.LlamaServer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from .peer_server import HOST, free_port


def wait_healthy(base: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Return once base/health answers 200; an error if proc exits first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"swarmkv serve exited with {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{base} not healthy after {timeout_s} s")


class ServeProcess:
    """`python -m swarmkv serve ARGS --port FREE`; output to log_path (a temporary file by
    default). `base_url` is http://127.0.0.1:PORT; `returncode` is set after stop()."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.args = list(args)
        self.log_path = log_path or Path(
            tempfile.mkstemp(prefix="swarmkv-serve-", suffix=".log")[1]
        )
        self.env = env
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> ServeProcess:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Launch and wait for /health 200; a server that exits first is an error."""
        self._log = self.log_path.open("wb")
        cmd = [sys.executable, "-m", "swarmkv", "serve", "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        try:
            wait_healthy(self.base_url, self.start_timeout_s, self.proc)
        except RuntimeError as exc:  # it exited: say why, from its log
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{exc}: {tail}") from None
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the process group; returns the exit status."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc is not None:
            self.returncode = proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.returncode
