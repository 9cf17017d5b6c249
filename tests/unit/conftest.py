"""Fixtures of the unit tier: the fake llama-server (fake_llama_server.py) in a thread, or as
a fake binary that LlamaServer starts and stops like the real one."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_llama_server import HELP_TEXT, FakeServer, serving


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    with serving() as server:
        yield server


@pytest.fixture
def fake_binary(tmp_path: Path) -> Path:
    script = tmp_path / "llama-server"
    fake = Path(__file__).resolve().parent / "fake_llama_server.py"
    # --help answered by the shell: it is asked once per binary path, and Python starts slowly.
    script.write_text(
        f'#!/bin/sh\ncase " $* " in *" --help "*) cat <<"EOF"\n{HELP_TEXT}EOF\nexit 0;; esac\n'
        f'exec "{sys.executable}" "{fake}" "$@"\n'
    )
    script.chmod(0o755)
    return script
