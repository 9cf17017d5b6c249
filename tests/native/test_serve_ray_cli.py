"""`swarmkv serve --ray-replicas 2` as a user runs it: the command starts its own local Ray
instance, serves the OpenAI routes through two replicas, and on SIGTERM takes everything down
(Serve, Ray and every process they started) and exits 0; with `--address` it joins a cluster
started apart (`ray start --head`, as on a real cluster's head node) and leaves it running."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from swarmkv_bench.peer_server import free_port
from swarmkv_bench.serve_process import ServeProcess

from support.proc import child_env

pytest.importorskip("ray", reason="the [test] extra installs ray; this install lacks it")

pytestmark = [pytest.mark.slow, pytest.mark.serve]  # the slow tier: Ray


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def test_the_command_serves_and_leaves_nothing_behind(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    args = ["--ray-replicas", "2", "-m", str(tiny_model_path), "-t", "1", "-c", "2048"]
    server = ServeProcess(
        [*args, "--chat-template", "chatml", "--log-level", "warning"],
        log_path=tmp_path / "serve.log",
        env=child_env(),
        start_timeout_s=180,
    )
    with server:
        assert server.proc is not None
        c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in c.models.list().data] == ["tiny-llama-seed0"]
        r = c.chat.completions.create(
            model="tiny-llama-seed0",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=6,
            temperature=0,
        )
        assert r.usage is not None and r.usage.completion_tokens == 6
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the replicas report their status every second
            status = httpx.get(server.base_url + "/v1/status", timeout=10).json()
            if len(status["replicas"]) == 2:
                break
            time.sleep(0.3)
        assert len(status["replicas"]) == 2, status
        started = _descendants(server.proc.pid)  # Ray's processes, the replicas among them
        assert len(started) >= 4, [p.name() for p in started]
    assert server.returncode == 0, server.log_path.read_text()[-3000:]
    _, alive = psutil.wait_procs(started, timeout=30)
    for p in alive:  # a leak: end it, then say so
        p.kill()
    assert not alive, [p.info if hasattr(p, "info") else p.pid for p in alive]


# Ray >= 2.59 starts clusters with token authentication: the head and every process that
# joins it must hold the same token (a fresh one here, not the user's ~/.ray/auth_token)
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def _ray(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    ray = Path(sys.executable).parent / "ray"  # the CLI of the ray this venv installed
    return subprocess.run(
        [str(ray), *args], capture_output=True, text=True, timeout=timeout, env=child_env(AUTH)
    )


def _status(base_url: str, replicas: int) -> dict:
    deadline = time.monotonic() + 30
    while True:  # the replicas report their status every second
        status = httpx.get(base_url + "/v1/status", timeout=10).json()
        if len(status["replicas"]) == replicas or time.monotonic() > deadline:
            return status
        time.sleep(0.3)


def test_address_joins_a_cluster_started_apart_and_leaves_it_running(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    port = free_port()
    head = _ray("start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                "--disable-usage-stats")  # fmt: skip
    assert head.returncode == 0, head.stderr[-2000:]
    address = f"127.0.0.1:{port}"
    try:
        args = ["--ray-replicas", "2", "--address", address, "-m", str(tiny_model_path)]
        server = ServeProcess(
            [*args, "-t", "1", "-c", "2048", "--log-level", "warning"],
            log_path=tmp_path / "serve.log",
            env=child_env(AUTH),
            start_timeout_s=180,
        )
        with server:
            c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
            r = c.completions.create(
                model="tiny-llama-seed0", prompt="Hello there", max_tokens=6, temperature=0
            )
            assert r.usage is not None and r.usage.completion_tokens == 6
            status = _status(server.base_url, 2)
            assert len(status["replicas"]) == 2, status
            # the replicas run in the cluster's processes, not under the command
            assert server.proc is not None
            replicas = [psutil.Process(rep["pid"]) for rep in status["replicas"]]
            assert not {p.pid for p in replicas} & {p.pid for p in _descendants(server.proc.pid)}
        assert server.returncode == 0, server.log_path.read_text()[-3000:]
        alive = _ray("status", f"--address={address}", timeout=60)
        assert alive.returncode == 0, alive.stderr[-2000:]  # the cluster outlived the command
        _, left = psutil.wait_procs(replicas, timeout=30)
        assert not left, left  # the command took its replicas down with it
    finally:
        _ray("stop", "--force", timeout=120)
