"""The `curl` examples of docs/guide/serve.md work as written: every ```bash block that starts
with `curl` runs, with only the port changed, against `swarmkv serve` on the tiny model
(`--chat-template chatml`), exits 0 and prints a JSON answer, or server-sent events ending in
`data: [DONE]`, with no "error" in it. A block that sends an API key runs against a server
started with that key, and fails without it."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.serving import Served, serve_process

pytestmark = [pytest.mark.slow, pytest.mark.serve]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "serve.md"
DOC_ADDRESS = "127.0.0.1:8000"
KEY_RE = re.compile(r"Authorization: Bearer (\S+?)'")


def curl_blocks() -> list[str]:
    blocks = re.findall(r"^```bash\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.S | re.M)
    return [b for b in blocks if b.lstrip().startswith("curl")]


BLOCKS = curl_blocks()


def serve(tiny_model_path: Path, tmp: Path, *extra: str) -> Iterator[Served]:
    args = ["-m", str(tiny_model_path), "--chat-template", "chatml", "-c", "2048", "-t", "2"]
    with serve_process([*args, *extra], tmp) as s:
        yield s


@pytest.fixture(scope="module")
def plain(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serve(tiny_model_path, tmp_path_factory.mktemp("docs-plain"))


@pytest.fixture(scope="module")
def keyed(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    keys = sorted({k for b in BLOCKS for k in KEY_RE.findall(b)})
    assert keys, "no block sends a key"
    extra = [a for k in keys for a in ("--api-key", k)]
    yield from serve(tiny_model_path, tmp_path_factory.mktemp("docs-keyed"), *extra)


def run_block(block: str, served: Served) -> subprocess.CompletedProcess[str]:
    assert DOC_ADDRESS in block, f"the example does not use {DOC_ADDRESS}: {block}"
    address = served.base.removeprefix("http://")
    cmd = block.replace(DOC_ADDRESS, address)
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)


def answer(stdout: str) -> list[Any]:
    """The JSON objects printed: one answer, or each event of a stream (which must end in
    `data: [DONE]`)."""
    text = stdout.strip()
    assert text, "no output"
    if not text.startswith("data:"):
        return [json.loads(text)]
    data = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data:")]
    assert data[-1] == "[DONE]", data[-3:]
    assert len(data) >= 3, data  # at least one chunk besides the final one
    return [json.loads(d) for d in data[:-1]]


def test_the_guide_has_curl_examples_of_both_endpoints_and_a_stream() -> None:
    text = "\n".join(BLOCKS)
    assert len(BLOCKS) >= 4, BLOCKS
    assert "/v1/completions" in text and "/v1/chat/completions" in text
    assert any('"stream": true' in b for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_a_curl_example_answers(block: str, plain: Served, keyed: Served) -> None:
    keyed_block = KEY_RE.search(block) is not None
    out = run_block(block, keyed if keyed_block else plain)
    assert out.returncode == 0, out.stderr
    objects = answer(out.stdout)
    for obj in objects:
        assert isinstance(obj, dict) and "error" not in obj, obj
    first = objects[0]
    if "/completions" in block:
        assert first["object"].startswith(("text_completion", "chat.completion")), first
        assert first["system_fingerprint"].endswith("-exact"), first
    if keyed_block:  # the key is what lets it through
        bare = run_block(KEY_RE.sub("X-Nothing: none'", block), keyed)
        assert json.loads(bare.stdout)["error"]["code"] == "invalid_api_key", bare.stdout
