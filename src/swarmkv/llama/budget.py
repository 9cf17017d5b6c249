"""Context budget: does a pipeline fit in n_ctx? Checked before any context or buffer exists."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ContextBudgetError

GGML_MAX_N_THREADS = 512  # ggml.h: a threadpool larger than this is refused or truncated

# Cells kept free beyond the exact need: llama.cpp pads the KV view and a stop-string check may
# decode a token past the last one returned.
DEFAULT_HEADROOM = 16
# Context sizes are rounded up to this (llama.cpp pads n_ctx to 256 anyway).
CTX_ROUND = 256


@dataclass(frozen=True)
class BranchNeed:
    """What one branch needs of the context, in tokens."""

    name: str
    prompt_tokens: int
    n_predict: int
    prefix_tokens: int  # the part of the document this branch reads (W, or all of it)

    @property
    def tokens(self) -> int:
        """Tokens the branch adds after its prefix: prompt plus n_predict."""
        return self.prompt_tokens + self.n_predict


def round_ctx(n: int) -> int:
    """n rounded up to a multiple of CTX_ROUND (256)."""
    return -(-n // CTX_ROUND) * CTX_ROUND


def plan_budget(
    prefix_tokens: int,
    branches: Sequence[BranchNeed],
    *,
    mode: str,
    n_ctx: int | None,
    n_ctx_train: int,
    headroom: int = DEFAULT_HEADROOM,
) -> int:
    """n_ctx of the contexts branches run in, or ContextBudgetError naming every number.

    host/baseline: each branch has its own context: prefix + prompt + n_predict + headroom.
    fork: one unified context holds the prefix once plus every branch's own tokens.
    n_ctx=None picks the smallest fitting size (rounded up to 256); a given n_ctx must fit.
    """
    if not branches:
        raise ContextBudgetError("a pipeline needs at least one branch")
    longest = max(branches, key=lambda b: b.prefix_tokens + b.tokens)
    per_branch = longest.prefix_tokens + longest.tokens + headroom
    shared = prefix_tokens + sum(b.tokens for b in branches) + headroom
    need = shared if mode == "fork" else per_branch
    limit = n_ctx if n_ctx is not None else n_ctx_train
    if need > limit:
        raise ContextBudgetError(
            _explain(
                mode,
                prefix_tokens,
                branches,
                longest,
                headroom,
                need,
                limit,
                "n_ctx" if n_ctx is not None else "n_ctx_train",
            )
        )
    return n_ctx if n_ctx is not None else min(round_ctx(need), n_ctx_train)


def _explain(
    mode: str,
    prefix: int,
    branches: Sequence[BranchNeed],
    longest: BranchNeed,
    headroom: int,
    need: int,
    limit: int,
    limit_name: str,
) -> str:
    if mode == "fork":
        parts = " + ".join(f"{b.name}:{b.prompt_tokens}+{b.n_predict}" for b in branches)
        return (
            f"fork mode needs prefix {prefix} + branches ({parts}) + headroom {headroom} "
            f"= {need} tokens > {limit_name}={limit}"
        )
    return (
        f"branch {longest.name!r} needs prefix {longest.prefix_tokens} + prompt "
        f"{longest.prompt_tokens} + n_predict {longest.n_predict} + headroom {headroom} "
        f"= {need} tokens > {limit_name}={limit}"
    )
