"""Sampling settings and the token callback type: plain data, no native code.

`SamplerConfig` is validated before any sampler chain exists (swarmkv.llama.batch.Sampler builds
the chain from it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..checks import check_int, check_number
from ..errors import ConfigError
from .config import INT32_MAX
from .constraint import Constraint

# on_token(branch name, token id, decoded piece): called once per generated token
TokenCallback = Callable[[str, int, str], None]
# on_row(logits row, sampled token): called once per sample, before the token is recorded;
# the row is llama.cpp's own buffer, valid only during the call
RowCallback = Callable[[Any, int], None]


@dataclass(frozen=True)
class SamplerConfig:
    """temperature == 0 means greedy; otherwise top-k, top-p, min-p, temperature, then dist.

    constraint: what the output must match (a JSON schema, a regex, a choice, a grammar),
    applied to each row's logits before the chain runs (swarmkv.llama.guide; GBNF as the
    chain's first stage, llama.cpp's grammar sampler)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int = 0
    constraint: Constraint | None = None

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field (types, NaN and infinities included)."""
        if check_number("temperature", self.temperature) < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None:  # llama_sampler_init_top_k takes an int32_t
            check_int("top_k", self.top_k, lo=1, hi=INT32_MAX)
        for name in ("top_p", "min_p"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= check_number(name, value) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {value}")
        if not 0 <= check_int("seed", self.seed) < 2**32:
            raise ConfigError(f"seed must be in [0, 2**32), got {self.seed}")
        if self.constraint is not None:
            if not isinstance(self.constraint, Constraint):
                raise ConfigError(f"constraint must be a Constraint, got {self.constraint!r}")
            self.constraint.validate()

    @property
    def greedy(self) -> bool:
        """Whether sampling is argmax (temperature 0): seed and top-k/p are then unused."""
        return self.temperature == 0.0
