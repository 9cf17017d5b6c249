"""Which replica a request goes to: the longest prefix of its tokens, then load. Plain Python
(prefix_router.py feeds it Ray Serve's replicas and queue lengths; unit-tested without Ray).

Rules, in order:
  1. The replicas whose record (prefix_record.py) holds the longest prefix of the request's
     tokens are its affine ones, if that prefix is at least `min_match_tokens` long (a BOS or
     a chat template's first tokens, which every request shares, say nothing); so are those
     whose match falls short of the longest by less than `min_match_tokens` (a head every
     replica holds, one of them with a question's first words too: those few tokens save
     less than a queue costs).
  2. Among them the least loaded wins (ongoing requests), then the longer match, then the
     one with the smaller record, then the smaller id (so that a choice is reproducible).
  3. Unless it has more than `max_imbalance` requests more than the least loaded replica:
     then the least loaded wins (a longer match, then the smaller record, then the id break
     ties). So a hot prefix spills over to a second replica instead of queueing behind itself.
  4. Without an affine replica the least loaded wins (then as in 3): new prefixes
     are spread over the replicas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..checks import check_int

ROUTINGS = ("prefix", "round-robin")


@dataclass(frozen=True)
class AffinityConfig:
    """The router's settings (`swarmkv serve --max-imbalance`, the rest through the API)."""

    max_imbalance: int = 4  # requests more than the least loaded replica, at most
    min_match_tokens: int = 16  # a shorter common prefix is no affinity
    max_tokens_per_replica: int = 8192  # the record's budget (default: one engine's KV cells)

    def check(self) -> None:
        """ConfigError naming the first bad number."""
        check_int("max_imbalance", self.max_imbalance, lo=0)
        check_int("min_match_tokens", self.min_match_tokens, lo=1)
        check_int("max_tokens_per_replica", self.max_tokens_per_replica, lo=1)


def choose(
    loads: Mapping[str, int],
    matches: Mapping[str, int],
    sizes: Mapping[str, int],
    config: AffinityConfig,
) -> list[str]:
    """Every replica of loads (id -> ongoing requests), best first, by the module's rules.
    matches: id -> tokens of the request's prefix on record; sizes: id -> tokens on record."""
    if not loads:
        return []
    least = min(loads.values())
    # a match below the minimum is none: it must not outweigh the smaller record either
    match = {r: m for r, m in matches.items() if r in loads and m >= config.min_match_tokens}

    def by_load(r: str) -> tuple[int, int, int, str]:
        return (loads[r], -match.get(r, 0), sizes.get(r, 0), r)

    order = sorted(loads, key=by_load)
    if not match:
        return order
    best = max(match.values())
    near_best = (r for r in match if best - match[r] < config.min_match_tokens)
    affine = min(near_best, key=by_load)
    if loads[affine] - least > config.max_imbalance:
        return order
    return [affine, *(r for r in order if r != affine)]
