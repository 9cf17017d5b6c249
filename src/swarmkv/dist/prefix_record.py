"""What the prefix-affinity router sent where: a radix tree of token prefixes, each run marked
with the replicas that were sent a request starting with it. Plain Python, no Ray: the router
(prefix_router.py) owns one and calls it from its event loop only.

| field    | meaning                                                              |
|----------|----------------------------------------------------------------------|
| tokens   | the run's token ids: positions depth .. depth+len-1 of every request through it |
| seen     | replica id -> the logical time a request through this run was last sent to it |
| children | first token -> the run that follows                                   |

Invariants: a run's replicas include each of its children's (a request marks its whole
path), so a replica's match is the depth of the deepest run it is marked on; `sizes[r]` is
the number of tokens of the runs r is marked on. After each insert no replica holds more than
`max_tokens` (its least recently sent leaves go first), and every run is marked by at least one
replica (an unmarked run is cut off), so the whole tree holds at most replicas x max_tokens
tokens.

It is a record of what was sent, not of what each engine still holds: an engine evicts idle
sequences on its own (least recently used), which is why the budget per replica defaults to
one engine's KV cells.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..serve.prefix_tree import common_run

# eviction goes down to this fraction of the budget, so that it runs once per many inserts
LOW_WATER = 0.9


@dataclass(eq=False)
class Run:
    """One run of tokens (see the module table)."""

    tokens: list[int]
    parent: Run | None
    seen: dict[str, int] = field(default_factory=dict)
    children: dict[int, Run] = field(default_factory=dict)


class PrefixRecord:
    """Token prefixes per replica, bounded (see the module docstring)."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ConfigError(f"the prefix record's budget must be >= 1 token, got {max_tokens}")
        self.max_tokens = max_tokens
        self.root = Run([], None)
        self.sizes: dict[str, int] = {}
        self._clock = itertools.count(1)

    @property
    def replicas(self) -> list[str]:
        """The replicas with a prefix on record."""
        return list(self.sizes)

    def match(self, tokens: Sequence[int]) -> dict[str, int]:
        """Per replica, how many leading tokens of tokens it was sent (absent: none)."""
        out: dict[str, int] = {}
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = common_run(child.tokens, tokens, i)
            for replica in child.seen:  # deeper runs overwrite: a replica's deepest wins
                out[replica] = i + k
            if k < len(child.tokens):
                break
            node, i = child, i + k
        return out

    def insert(self, replica: str, tokens: Sequence[int]) -> None:
        """Record that a request of tokens went to replica, then keep replica within budget."""
        now = next(self._clock)
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                child = Run(list(tokens[i:]), node)
                node.children[tokens[i]] = child
                self._mark(child, replica, now)
                break
            k = common_run(child.tokens, tokens, i)
            if k < len(child.tokens):
                child = self._split(child, k)
            self._mark(child, replica, now)
            node, i = child, i + k
        if self.sizes.get(replica, 0) > self.max_tokens:
            self._evict(replica, int(self.max_tokens * LOW_WATER))

    def drop(self, replica: str) -> None:
        """Forget replica (it died, or left the deployment)."""
        if self.sizes.pop(replica, None) is None:
            return
        stack = [self.root]
        while stack:
            node = stack.pop()
            for child in list(node.children.values()):
                if replica in child.seen:
                    stack.append(child)
                    del child.seen[replica]
                    if not child.seen:  # nobody else: the whole subtree is unmarked
                        del node.children[child.tokens[0]]

    def _mark(self, run: Run, replica: str, now: int) -> None:
        if replica not in run.seen:
            self.sizes[replica] = self.sizes.get(replica, 0) + len(run.tokens)
        run.seen[replica] = now

    @staticmethod
    def _split(run: Run, k: int) -> Run:
        """Cut run after its first k tokens; the upper part (returned) keeps run's replicas,
        which were sent all of it, so no size changes."""
        parent = run.parent
        assert parent is not None and 0 < k < len(run.tokens)
        upper = Run(run.tokens[:k], parent, dict(run.seen))
        parent.children[run.tokens[0]] = upper
        run.tokens, run.parent = run.tokens[k:], upper
        upper.children[run.tokens[0]] = run
        return upper

    def _leaves(self, replica: str) -> list[Run]:
        """The runs replica is marked on and none of whose children it is."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            below = [c for c in node.children.values() if replica in c.seen]
            if not below and node is not self.root:
                out.append(node)
            stack.extend(below)
        return out

    def _evict(self, replica: str, target: int) -> None:
        """Unmark replica's least recently sent leaves until it holds at most target tokens."""
        heap = [(leaf.seen[replica], id(leaf), leaf) for leaf in self._leaves(replica)]
        heapq.heapify(heap)
        while heap and self.sizes[replica] > target:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del leaf.seen[replica]
            self.sizes[replica] -= len(leaf.tokens)
            if not leaf.seen:
                del parent.children[leaf.tokens[0]]
            if parent is not self.root and not any(
                replica in c.seen for c in parent.children.values()
            ):
                heapq.heappush(heap, (parent.seen[replica], id(parent), parent))

    def total_tokens(self) -> int:
        """Tokens in the tree (each run once): at most replicas x max_tokens."""
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += len(node.tokens)
            stack.extend(node.children.values())
        return total
