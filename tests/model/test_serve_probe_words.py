"""The HTTP overhead probe's premise (swarmkv_bench.serve_bench.overhead): after the bench's
head, every probe's question starts with a token of its own, so the server's prefix cache,
which keeps the earlier probes, spares it no token of a later one that the Swarm decodes."""

from __future__ import annotations

from pathlib import Path

import pytest

import swarmkv as sk
from swarmkv_bench.probe_words import PROBE_WORDS, probe_question
from swarmkv_bench.serve_bench import ServeBenchOptions
from swarmkv_bench.workload import document


def test_every_probe_starts_with_a_token_of_its_own(model: sk.Model) -> None:
    head = document(model, 3501)
    head_tokens = model.tokenize(head, add_special=True, parse_special=True)
    firsts = []
    for i in range(len(PROBE_WORDS)):
        tokens = model.tokenize(head + probe_question(i), add_special=True, parse_special=True)
        assert tokens[: len(head_tokens)] == head_tokens  # the head's tokens, unchanged
        firsts.append(tokens[len(head_tokens)])
    assert len(set(firsts)) == len(firsts)


def test_no_probe_repeats_a_word() -> None:
    # the default: the warm-up probe and the measured ones take every word once
    assert ServeBenchOptions(model=Path("m.gguf"), head="", head_tokens=0).probes + 1 == len(
        PROBE_WORDS
    )
    with pytest.raises(IndexError):  # past the words: refused, never a repeat
        probe_question(len(PROBE_WORDS))
