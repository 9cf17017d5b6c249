"""Benchmark workloads: the paper's synthetic document, real text, and branch prompts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from swarmkv.errors import ConfigError

FOX = "The quick brown fox jumps over the lazy dog. "
# The paper's two branches asked different questions of the same document; its exact prompt
# text is not given, so these stand in (the same for every mode, peers included).
PAPER_PROMPTS = (
    "\n\nQuestion: What does the fox do?\nAnswer:",
    "\n\nSummarize the text above in one sentence:",
)
PROMPTS = (
    *PAPER_PROMPTS,
    "\n\nQuestion: Which animal is lazy?\nAnswer:",
    "\n\nList three words that appear in the text:",
    "\n\nWrite a title for the text above:",
    "\n\nQuestion: How many times does the sentence repeat?\nAnswer:",
    "\n\nTranslate the first sentence into French:",
    "\n\nQuestion: What colour is the fox?\nAnswer:",
)


class Tokenizer(Protocol):
    """What a workload needs of a model: text to token ids and back (Model satisfies it)."""

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids of text; add_special adds BOS where the model asks for it."""
        ...

    def detokenize(self, tokens: list[int]) -> str:
        """Text of the token ids."""
        ...


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark configuration: branches, document tokens, tokens generated per branch."""

    n_branches: int
    doc_tokens: int
    n_predict: int

    @property
    def config_id(self) -> str:
        """The config's label, e.g. N2-D3501-P16 (branches, document tokens, n_predict)."""
        return f"N{self.n_branches}-D{self.doc_tokens}-P{self.n_predict}"


def document(model: Tokenizer, n_tokens: int, source: Path | None = None) -> str:
    """A document of exactly n_tokens tokens (BOS included) cut from source or the fox text.

    Cutting by tokens can end mid-sentence, which fidelity must survive anyway.
    """
    base = source.read_text(encoding="utf-8") if source else FOX * (n_tokens // 8 + 16)
    return text_document(model, n_tokens, base, str(source) if source else "the fox text")


def text_document(model: Tokenizer, n_tokens: int, base: str, name: str = "the text") -> str:
    """The start of base that is exactly n_tokens tokens (BOS included)."""
    body = model.tokenize(base, add_special=False)
    if len(body) < n_tokens - 1:
        raise ConfigError(f"{name} has {len(body)} tokens; {n_tokens} were asked for")
    text = model.detokenize(body[: n_tokens - 1])
    got = len(model.tokenize(text))
    if got != n_tokens:  # a retokenization merge at the cut: trim until it fits
        text = model.detokenize(body[: n_tokens - 1 - (got - n_tokens)])
    return text


def prompts_for(n: int, paper: bool = False) -> list[str]:
    """n branch prompts taken in turn from PROMPTS (PAPER_PROMPTS with paper).

    Once the pool is used up, repeated prompts end in " (i)" so every prompt differs.
    """
    pool = PAPER_PROMPTS if paper else PROMPTS
    return [pool[i % len(pool)] + ("" if i < len(pool) else f" ({i})") for i in range(n)]
