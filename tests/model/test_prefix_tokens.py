"""PrefixTokenizer (swarmkv.llama.prefix_tokens) on the default model's SentencePiece vocabulary:
every text's tokens equal llama_tokenize's of the whole text, whatever it shares with the texts
before it; reuse really happens; and a cut that ignores the rule gets tokens wrong (so the
property below can fail). Tokenizers without a proof are never cut."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import swarmkv as sk
from swarmkv.llama.prefix_tokens import MIN_SHARED_CHARS, PrefixTokenizer

from support.realmodel import REPO, document
from support.tinymodel import VOCAB_DIR, make_tiny_model

# llama.cpp's own tokenizer test inputs (hard cases: whitespace runs, scripts, emoji, code)
CORPUS_FILE = REPO / "vendor" / "llama.cpp" / "models" / "ggml-vocab-llama-spm.gguf.inp"
SPECIALS = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>", "<unk>"]
SMALL = [" ", "  ", "\n", "\n\n", "\t", "\r\n", "\u2581", ".", "?", ",", "'", "é", "日本", "🙂",
         " the", "ing", "the", "The", "<", ">", "0", "123", "-", "**", "#"]  # fmt: skip


@pytest.fixture(scope="module")
def doc(model: sk.Model) -> str:
    return document(model, 1600)


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    texts = CORPUS_FILE.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    return [t for t in texts if t]


def pieces(corpus: list[str]) -> st.SearchStrategy[str]:
    """Text made of llama.cpp's test inputs, special tokens' texts, spaces and odd characters."""
    part = st.one_of(
        st.sampled_from(SMALL), st.sampled_from(SPECIALS), st.sampled_from(corpus),
        st.text(max_size=6),
    )  # fmt: skip
    return st.lists(part, max_size=8).map("".join)


@pytest.mark.parametrize(("add_special", "parse_special"), [(True, True), (False, False)])
def test_tokens_equal_the_whole_texts(
    model: sk.Model, doc: str, corpus: list[str], add_special: bool, parse_special: bool
) -> None:
    tok = PrefixTokenizer(model, add_special=add_special, parse_special=parse_special)
    assert tok.enabled, tok.rule

    def whole(text: str) -> list[int]:
        return model.tokenize(text, add_special=add_special, parse_special=parse_special)

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        shared=st.integers(MIN_SHARED_CHARS, len(doc)),
        lead=pieces(corpus),
        before=pieces(corpus),
        after=pieces(corpus),
    )
    def check(shared: int, lead: str, before: str, after: str) -> None:
        start = lead + doc[:shared]
        for text in (start + before, start + after, start, start + before + after):
            assert tok.tokenize(text) == whole(text), repr(text[-80:])

    check()
    assert tok.reused_tokens > 0


def test_a_question_after_the_document_tokenizes_only_the_question(
    model: sk.Model, doc: str
) -> None:
    tok = PrefixTokenizer(model)
    head = "<start_of_turn>user\n" + doc
    first = tok.tokenize(head + "\n\nWhat is this about?<end_of_turn>\n")
    reused = tok.reused_tokens
    text = head + "\n\nWho wrote it?<end_of_turn>\n"
    assert tok.tokenize(text) == model.tokenize(text, add_special=True, parse_special=True)
    # all but the few tokens before a safe cut near the question's start came from the first
    assert tok.reused_tokens - reused >= len(first) - 20
    again = tok.reused_tokens
    same = tok.tokenize(text)  # the same text again: every token reused
    assert same == model.tokenize(text, add_special=True, parse_special=True)
    assert tok.reused_tokens - again == len(same)


def test_cuts_that_ignore_the_rule_give_other_tokens(model: sk.Model, doc: str) -> None:
    """Every cut allowed (an empty set of unsafe pairs): some texts then tokenize differently
    from llama_tokenize, which is what the rule prevents (and the property above checks)."""
    careless = PrefixTokenizer(model)
    careless.pairs = frozenset()
    wrong = 0
    for n in range(MIN_SHARED_CHARS, MIN_SHARED_CHARS + 400, 7):
        careless.tokenize(doc[:n] + "\n\n")  # the donor: its tokens end where doc[:n] does
        text = doc[:n] + doc[n : n + 40]
        wrong += careless.tokenize(text) != model.tokenize(text, parse_special=True)
    assert wrong > 0


def test_remembers_at_most_capacity_texts(model: sk.Model, doc: str) -> None:
    tok = PrefixTokenizer(model, capacity=3)
    texts = [doc[:MIN_SHARED_CHARS] + f" variant {i}" for i in range(5)]
    for text in texts:
        tok.tokenize(text)
    assert list(tok._recent) == texts[2:] and tok._sorted == sorted(texts[2:])


@pytest.mark.parametrize(
    ("vocab", "reason"),
    [
        ("ggml-vocab-llama-spm.gguf", "space prefix"),  # SentencePiece, but a space per piece
        ("ggml-vocab-gpt-2.gguf", "bpe tokenizer"),
    ],
)
def test_tokenizers_without_a_proof_are_never_cut(tmp_path: Path, vocab: str, reason: str) -> None:
    path = make_tiny_model(tmp_path / "tiny.gguf", seed=0, vocab_path=VOCAB_DIR / vocab)
    with sk.Model(path) as tiny:
        tok = PrefixTokenizer(tiny)
        assert not tok.enabled and reason in tok.rule
        text = "word " * MIN_SHARED_CHARS
        for suffix in ("one", "two"):
            assert tok.tokenize(text + suffix) == tiny.tokenize(
                text + suffix, add_special=True, parse_special=True
            )
        assert tok.reused_tokens == 0
