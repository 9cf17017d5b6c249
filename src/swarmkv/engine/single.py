"""The engine on one sequence: a prefill, and one branch's prompt and generation. Host,
baseline, snapshot creation and the tests' reference decoding all go through these, so a
lone sequence is decoded with exactly the batch shapes of the shared runs' documents and
of a per_branch fork."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .core import Engine
from .stats import DecodeStats
from .work import Document, Request


def prefill(
    ctx: Any,
    tokens: Sequence[int],
    bounds: Sequence[tuple[int, int]],
    *,
    seq_id: int = 0,
    done: int = 0,
    on_progress: Callable[[int], None] | None = None,
    check: Callable[[], None] | None = None,
    logits_last: bool = False,
) -> Document:
    """Decode tokens[lo:hi] for each bound at absolute positions on seq_id (tokens before
    `done` are already in the cells); check() runs between chunks. Raises the decode's
    error if a chunk failed. logits_last: the last token's logits are kept, in batch row
    `last_row` of the returned Document (valid until the context's next decode)."""
    end = bounds[-1][1] if bounds else done  # a baseline may stop at a branch's watermark
    doc = Document("prefill", list(tokens[:end]), seq_id, list(bounds), done, on_progress)
    doc.logits_last = logits_last
    engine = Engine(ctx, packing_name="per_branch")
    try:
        engine.add_document(doc)
        engine.run(check)
    finally:
        engine.close()
    if doc.error is not None:
        raise doc.error
    return doc


def decode_branch(
    ctx: Any,
    req: Request,
    *,
    packing_name: str = "per_branch",
    stats: DecodeStats | None = None,
    check: Callable[[], None] | None = None,
) -> Request:
    """Decode req (its prefix already in its sequence's cells) until it stops; returns it
    with its state (tokens, text, error)."""
    engine = Engine(ctx, packing_name=packing_name, stats=stats)
    try:
        engine.submit(req)
        engine.run(check)
    except BaseException as exc:
        engine.abort(exc)
        raise
    finally:
        engine.close()
    return req
