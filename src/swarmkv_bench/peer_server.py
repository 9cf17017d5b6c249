"""llama-server as a process: finding the binary, its command line and KV sizing, and
`LlamaServer`, which owns the process (started on loopback, stopped by PID). See peer.py.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import IO, Literal, Protocol

from swarmkv.errors import ConfigError, SwarmKVError
from swarmkv.llama.budget import round_ctx

from .sysinfo import proc_status_bytes

log = logging.getLogger("swarmkv.bench.peer")

# The llama-server setups, named once: np1 (one slot, branches in turn), npN (one slot per
# branch, one unified KV buffer, so slots can share the document's cells) and npNslots (one
# slot per branch, each with its own KV cache: every slot prefills the document itself).
# Bench mode names are these with "server-" before them.
Setup = Literal["np1", "npN", "npNslots"]
SETUPS: tuple[Setup, ...] = ("np1", "npN", "npNslots")
ENV_SERVER = "SWARMKV_LLAMA_SERVER"
ENV_BATCH_INVARIANT = "LLAMA_BATCH_INVARIANT"  # read by patch 0003 when a context is made
SERVER_RELPATH = Path("build/llama-server/bin/llama-server")
HOST = "127.0.0.1"  # the peer is a local benchmark subject: never listen beyond loopback
CTX_MARGIN = 32  # tokens per slot beyond prompt + n_predict: the server stops at n_ctx - 1
FLASH_ATTN = ("on", "off", "auto")


class Tokenizer(Protocol):
    """What count_tokens needs of a model: swarmkv.Model has it."""

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for text."""
        ...


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
    # LLAMA_BATCH_INVARIANT=1 in the server's environment (patch 0003 reads it for every
    # context) and --no-repack: weights as stored, as SwarmKV's exact contexts hold them
    # (like for like; repacked weights are batch-invariant too since patch 0011, not faster).
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        if self.n_ctx < 1 or self.n_parallel < 1 or self.threads < 1 or self.n_batch < 1:
            raise ConfigError(f"n_ctx, n_parallel, threads and n_batch must be >= 1: {self}")
        if self.flash_attn not in FLASH_ATTN:
            raise ConfigError(f"flash_attn must be one of {FLASH_ATTN}, got {self.flash_attn!r}")
        if self.batch_invariant and self.flash_attn == "off":
            raise ConfigError("batch-invariant kernels need flash attention: not flash_attn='off'")


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
    if config.batch_invariant:
        if options and "--no-repack" not in options:
            raise PeerServerError(
                f"{binary} has no --no-repack, which the batch-invariant peer uses (weights "
                "as stored, as SwarmKV's exact default): rebuild it with "
                "bench/build_llama_server.sh"
            )
        cmd.append("--no-repack")
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
        raise ConfigError("need prompt_tokens >= 1, n_predict >= 0 and n_parallel >= 1")
    per_slot = prompt_tokens + n_predict + margin
    if kv_unified:
        return round_ctx(per_slot * n_parallel)
    return round_ctx(per_slot) * n_parallel


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def count_tokens(tokenizer: Tokenizer, texts: tuple[str, ...]) -> tuple[int, ...]:
    """Token counts (with BOS) from SwarmKV's own tokenizer (the loaded Model the benchmark
    already holds): the same vocab code as the server."""
    return tuple(len(tokenizer.tokenize(text)) for text in texts)


# ----------------------------------------------------------------------------- process


def read_peak_rss(pid: int) -> int | None:
    """VmHWM (peak resident set) of a live process, in bytes; None when unreadable."""
    return proc_status_bytes("VmHWM", pid)


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(log unreadable: {exc})"


def _temp_log() -> Path:
    fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
    os.close(fd)  # reopened by LlamaServer for the child's output
    return Path(name)


def child_env(config: ServerConfig) -> dict[str, str]:
    """The server's environment: the caller's, less what would configure it behind the command
    line's back, plus LLAMA_BATCH_INVARIANT=1 exactly when the config asks for it."""
    # llama-server reads LLAMA_ARG_* variables as defaults for its options; the command line
    # must be the whole configuration, so none may leak in from the caller's environment.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LLAMA_ARG_") and k != ENV_BATCH_INVARIANT
    }
    if config.batch_invariant:
        env[ENV_BATCH_INVARIANT] = "1"
    return env


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
        """The server's http://127.0.0.1:port URL; PeerServerError if it was never started."""
        if self.port is None:
            raise PeerServerError("llama-server is not started")
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id; None before start and after stop."""
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
            env=child_env(self.config),
        )  # fmt: skip
        return self._proc.pid

    def _wait_healthy(self) -> None:
        from .peer_client import PeerClient  # the client imports this module's errors

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
