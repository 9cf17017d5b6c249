"""What the HTTP side computes from the model alone, before a request is queued: its prompt's
tokens, whether its constraint applies, whether it fits the context.

The single server's Runtime and the Ray ingress (swarmkv.dist.serve_ingress) both call these,
so a request is tokenized, and refused, the same way by either (the same tokens, the same
messages). The model is only read: llama.cpp's tokenizer and vocabulary are thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigError, ContextLengthError
from ..llama.constraint import Constraint
from ..llama.guide import check_gbnf, tokenizer_for
from ..llama.prefix_tokens import PrefixTokenizer

if TYPE_CHECKING:
    from ..llama.model import Model
    from .job import Job


def prompt_tokenizer(model: Model) -> PrefixTokenizer:
    """The tokenizer of text prompts: BOS and special tokens parsed, as llama-server does; the
    tokens of a start shared with a recent prompt reused (PrefixTokenizer)."""
    return PrefixTokenizer(model, add_special=True, parse_special=True)


def tokenize_prompt(
    tokenizer: PrefixTokenizer, model: Model, prompt: str | Sequence[int]
) -> list[int]:
    """A prompt's tokens: text through tokenizer, or token ids checked against the vocabulary
    (ConfigError naming the first outside it)."""
    if isinstance(prompt, str):
        return tokenizer.tokenize(prompt)
    n_vocab = model.n_vocab
    for t in prompt:
        if not 0 <= t < n_vocab:
            raise ConfigError(f"token id {t} is outside the vocabulary [0, {n_vocab})")
    return list(prompt)


def prepare_constraint(model: Model, constraint: Constraint) -> None:
    """ConfigError unless constraint applies to this model. GBNF: parsed by llama.cpp's grammar
    sampler on the vocabulary. llguidance: its tokenizer of the vocabulary built now (once per
    model, about a second for a large vocabulary), or an engine thread would stall every live
    request while it builds."""
    if constraint.by_llguidance:
        tokenizer_for(model)
    else:
        check_gbnf(model, constraint.text)


def check_fits(job: Job, n_ctx: int) -> None:
    """ContextLengthError when job's prompt and max_tokens can never fit a context of n_ctx
    cells (or its prompt holds no token)."""
    if not job.tokens:
        raise ContextLengthError("the prompt holds no token")
    if len(job.tokens) + job.max_tokens > n_ctx:
        raise ContextLengthError(
            f"this request needs {len(job.tokens)} prompt + {job.max_tokens} completion "
            f"tokens, more than the context's {n_ctx}"
        )
