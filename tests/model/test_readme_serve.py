"""The README's serving example works as written: its curl call and its `openai` client call,
against `swarmkv serve` on the default model (only the port is changed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.serving import serve_process

pytestmark = [pytest.mark.slow, pytest.mark.serve]
README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    return text[text.index("## Serving agents over HTTP") : text.index("## Which mode when")]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(), re.S)


def test_readme_starts_the_server_with_the_serve_extra() -> None:
    assert "pip install '.[serve]' && swarmkv serve" in _blocks("bash")[0]


def test_readme_curl_and_openai_calls_work(tmp_path: Path) -> None:
    with serve_process(["-c", "2048", "-t", "2"], tmp_path) as s:
        port = s.base.rsplit(":", 1)[1]
        curl = _blocks("bash")[1].replace("8000", port)
        out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        answer = json.loads(out.stdout)
        assert answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] == 16
        code = _blocks("python")[0].replace("8000", port)
        py = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert py.returncode == 0, py.stderr
        assert py.stdout.rstrip().endswith("-exact")
        assert answer["choices"][0]["text"] in py.stdout  # same request, same answer
