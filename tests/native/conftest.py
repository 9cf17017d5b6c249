"""Fixtures of the native tier: tiny random-weight llama models generated once per session.

Everything here runs on the CPU in a few seconds; no real model and no download is needed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import swarmkv

# tests/ holds tinymodel.py; it has no __init__.py, so put it on the path (not the repo root,
# which would shadow the installed swarmkv with the uncompiled source tree).
_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from tinymodel import make_tiny_model  # noqa: E402

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


def prefill_tokens(
    ctx: swarmkv.Context,
    tokens: Sequence[int],
    *,
    seq_id: int = 0,
    pos0: int | None = None,
    logits_last: bool = True,
) -> int:
    """Decode `tokens` into seq_id in chunks of ctx.n_batch, continuing where it ends.

    Returns the batch row of the last token (valid for ctx.logits until the next decode)
    when logits_last, else -1.
    """
    if pos0 is None:
        pos0 = ctx.seq_len(seq_id)
    row = -1
    with swarmkv.Batch(ctx.n_batch, ctx.n_seq_max) as batch:
        for start in range(0, len(tokens), ctx.n_batch):
            chunk = tokens[start : start + ctx.n_batch]
            last_chunk = start + ctx.n_batch >= len(tokens)
            batch.clear()
            row = batch.add_sequence(chunk, pos0 + start, seq_id, logits_last and last_chunk)
            ctx.decode(batch)
    return row if logits_last else -1


@pytest.fixture
def prefill() -> Prefill:
    """The prefill_tokens helper, as a fixture so test modules need not import conftest."""
    return prefill_tokens
