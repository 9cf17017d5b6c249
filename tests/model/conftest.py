"""Fixtures of the real-model tier: the default model (Gemma 3 270M, sliding window 512)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import swarmkv as sk

from support.realmodel import document


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/model/" in str(item.fspath):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def model() -> Iterator[sk.Model]:
    with sk.Model(sk.default_model_path()) as m:
        yield m


@pytest.fixture(scope="session")
def exact_model(model: sk.Model) -> sk.Model:
    """The model for batch-invariant runs: weights as stored, which is the default."""
    assert not model.repack
    return model


@pytest.fixture(scope="session")
def repacked_model() -> Iterator[sk.Model]:
    """The default model repacked: llama.cpp's fastest kernels (Pipeline(exact=False))."""
    with sk.Model(sk.default_model_path(), repack=True) as m:
        yield m


@pytest.fixture(scope="session")
def doc_short(model: sk.Model) -> str:
    """About 300 tokens: shorter than Gemma 3's 512-token sliding window."""
    return document(model, 300)


@pytest.fixture(scope="session")
def doc_long(model: sk.Model) -> str:
    """About 1500 tokens: well past the sliding window."""
    return document(model, 1500)
