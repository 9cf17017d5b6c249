"""Fixtures of the native tier: tiny random-weight llama models generated once per session.

Everything here runs on the CPU in a few seconds; no real model and no download is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import swarmkv

from support.decoding import prefill as prefill_tokens
from support.tinymodel import make_tiny_model

if TYPE_CHECKING:  # the serve fixtures import their extras when used: .ci/run's portable
    import openai  # venv has only pytest and gguf, and loads this conftest too

    from support.serving import Served

Prefill = Callable[..., int]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama-seed0.gguf", seed=0)


@pytest.fixture(scope="session")
def other_tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same shape and tokenizer as tiny_model_path, different weights."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama-seed1.gguf", seed=1)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path: Path) -> Iterator[swarmkv.Model]:
    model = swarmkv.Model(tiny_model_path)
    yield model
    model.close()


@pytest.fixture(scope="session")
def other_tiny_model(other_tiny_model_path: Path) -> Iterator[swarmkv.Model]:
    model = swarmkv.Model(other_tiny_model_path)
    yield model
    model.close()


@pytest.fixture(scope="session")
def prompt_tokens(tiny_model: swarmkv.Model) -> list[int]:
    """300 token ids of plain English (BOS first), for prefixes of any length up to 300."""
    text = (
        "SwarmKV prefills a shared document once and fans its key-value state out to many "
        "branches, each of which continues the document with its own question. "
    ) * 12
    tokens = tiny_model.tokenize(text)
    assert len(tokens) >= 300
    return tokens[:300]


@pytest.fixture
def prefill() -> Prefill:
    """support.decoding.prefill, as a fixture (the tests that take it as an argument)."""
    return prefill_tokens


@pytest.fixture(scope="module")
def served(tiny_model_path: Path) -> Iterator[Served]:
    """`swarmkv serve` in a thread on the tiny model (chatml chat template, 8 live), one per
    module that asks for it."""
    from support.serving import serve_in_thread, tiny_args

    argv = tiny_args(tiny_model_path, "--max-live", "8", "--chat-template", "chatml")
    with serve_in_thread(argv) as s:
        yield s


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    """The official `openai` client of `served`."""
    import openai

    return openai.OpenAI(base_url=served.v1, api_key="unused", max_retries=0)
