"""`swarmkv serve --ray-replicas 2` as a user runs it: the command starts its own local Ray
instance, serves the OpenAI routes through two replicas, and on SIGTERM takes everything down
(Serve, Ray and every process they started) and exits 0."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from swarmkv_bench.serve_process import ServeProcess

from support.proc import child_env

pytest.importorskip("ray", reason="the [test] extra installs ray; this install lacks it")

pytestmark = pytest.mark.slow  # the slow tier: Ray


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
