"""llama.cpp's and ggml's log output reaches logging.getLogger("swarmkv.llama") line by line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import swarmkv

LOGGER = "swarmkv.llama"


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def test_model_load_logs_reach_the_swarmkv_llama_logger(
    tiny_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER), swarmkv.Model(tiny_model_path):
        pass
    records = _records(caplog)
    messages = [r.getMessage() for r in records]
    assert any(
        "llama_model_loader" in m and "general.architecture" in m and "llama" in m for m in messages
    ), messages[:5]
    assert any(r.levelno == logging.INFO for r in records)
    assert any(r.levelno == logging.DEBUG for r in records)
    # pieces are joined into whole lines: none empty, none with a trailing newline
    assert all(m and not m.endswith("\n") for m in messages)


def test_context_creation_logs_its_size(
    tiny_model: swarmkv.Model, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger=LOGGER),
        swarmkv.Context(tiny_model, n_ctx=512, n_threads=1),
    ):
        pass
    assert any("n_ctx" in m and "512" in m for m in (r.getMessage() for r in _records(caplog)))


def test_llama_cpp_errors_are_logged_at_error_level(
    tiny_model_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tiny_model_path.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.INFO, logger=LOGGER), pytest.raises(swarmkv.ModelLoadError):
        swarmkv.Model(truncated)
    errors = [r.getMessage() for r in _records(caplog) if r.levelno == logging.ERROR]
    assert any("failed to load model" in m for m in errors), errors
