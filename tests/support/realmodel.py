"""Text for the real-model tier: natural English cut from the pinned llama.cpp tree."""

from __future__ import annotations

from pathlib import Path

import swarmkv as sk

REPO = Path(__file__).resolve().parents[2]
# Natural English prose from the pinned llama.cpp tree (present after any build of swarmkv).
DOC_SOURCE = REPO / "vendor" / "llama.cpp" / "SECURITY.md"


def document(model: sk.Model, n_tokens: int) -> str:
    """The first n_tokens tokens of DOC_SOURCE as text: it ends mid-sentence."""
    text = DOC_SOURCE.read_text(encoding="utf-8")
    tokens = model.tokenize(text, add_special=False)
    assert len(tokens) >= n_tokens, f"{DOC_SOURCE} has only {len(tokens)} tokens"
    return model.detokenize(tokens[:n_tokens])
