"""A radix tree of the token sequences resident in one unified KV cache: plain Python.

Each node is a run of tokens that exists **once** in the cache: the sequences that hold it
(its `holders`) got those cells from the sequence that decoded them (its `writer`), by
llama_memory_seq_cp. So the tree's token count is the number of KV cells in use, and a node
no sequence holds any more is cells freed. The server keeps that true by never decoding a
run the tree already has: a request whose longest match is still being decoded waits for it.

| field    | meaning                                                               |
|----------|-----------------------------------------------------------------------|
| tokens   | the run (positions depth .. depth+len-1 of every holder)              |
| holders  | seq ids whose cells hold the whole run; a child's are a subset        |
| writer   | the request id that decodes (or decoded) the run                      |
| scope    | who may share it: None for everyone (a pinned snapshot), else a key   |

Children are keyed by (scope, first token): two tenants that send the same text get two
runs, and neither ever reads the other's cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    """One run of tokens (see the module table)."""

    tokens: list[int]
    depth: int
    scope: str | None
    writer: int
    parent: Node | None = None
    holders: set[int] = field(default_factory=set)
    children: dict[tuple[str | None, int], Node] = field(default_factory=dict)

    @property
    def end(self) -> int:
        """The position after the run."""
        return self.depth + len(self.tokens)


@dataclass(frozen=True)
class Match:
    """The longest resident prefix of a request's tokens it may read: `length` tokens,
    ending in `node` (None when nothing matched), held by each of `holders`."""

    length: int
    node: Node | None
    holders: frozenset[int]


def common_run(a: Sequence[int], b: Sequence[int], start: int) -> int:
    """How many of a's tokens equal b's from b[start] on."""
    n = min(len(a), len(b) - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


class PrefixTree:
    """Sequences' tokens, shared runs once (see the module docstring)."""

    def __init__(self) -> None:
        self.root = Node([], 0, None, -1)
        self.cells = 0  # tokens in the tree: KV cells in use by resident sequences
        self._paths: dict[int, int] = {}  # seq id -> how many tokens it holds

    def holds(self, seq: int) -> int:
        """How many tokens seq holds (0 when it is not in the tree)."""
        return self._paths.get(seq, 0)

    @property
    def seqs(self) -> list[int]:
        """The sequences in the tree."""
        return list(self._paths)

    def _child(self, node: Node, scope: str | None, token: int) -> Node | None:
        if scope is not None and (scope, token) in node.children:
            return node.children[(scope, token)]
        return node.children.get((None, token))

    def match(self, tokens: Sequence[int], scope: str | None, limit: int | None = None) -> Match:
        """The longest prefix of tokens[:limit] that scope may read (its own runs and the
        public ones)."""
        want = tokens if limit is None else tokens[:limit]
        node, at = self.root, 0
        while at < len(want):
            child = self._child(node, scope, want[at])
            if child is None:
                break
            k = common_run(child.tokens, want, at)
            at += k
            node = child
            if k < len(child.tokens):
                break
        if node is self.root:
            return Match(0, None, frozenset())
        return Match(at, node, frozenset(node.holders))

    def _split(self, node: Node, k: int) -> Node:
        """Cut node after its first k tokens; returns the upper half (same holders)."""
        assert 0 < k < len(node.tokens) and node.parent is not None
        upper = Node(node.tokens[:k], node.depth, node.scope, node.writer, node.parent)
        upper.holders = set(node.holders)
        node.parent.children[(node.scope, node.tokens[0])] = upper
        node.tokens = node.tokens[k:]
        node.depth += k
        node.parent = upper
        upper.children[(node.scope, node.tokens[0])] = node
        return upper

    def insert(self, seq: int, tokens: Sequence[int], scope: str | None, writer: int) -> int:
        """Record that seq holds tokens (a sequence may grow: insert it again, longer).
        Runs it shares are joined; the rest become runs written by writer. Returns how many
        tokens are new to the tree (cells the writer decodes)."""
        assert len(tokens) >= self._paths.get(seq, 0), "a sequence only grows; truncate first"
        node, at, new = self.root, 0, 0
        while at < len(tokens):
            child = self._child(node, scope, tokens[at])
            if child is None:
                leaf = Node(list(tokens[at:]), at, scope, writer, node)
                node.children[(scope, tokens[at])] = leaf
                leaf.holders.add(seq)
                new += len(leaf.tokens)
                break
            k = common_run(child.tokens, tokens, at)
            if k < len(child.tokens):
                child = self._split(child, k)
            child.holders.add(seq)
            at += k
            node = child
        self.cells += new
        self._paths[seq] = len(tokens)
        return new

    def truncate(self, seq: int, n: int) -> int:
        """seq keeps only its first n tokens; returns the cells freed (runs no sequence
        holds any more)."""
        held = self._paths.get(seq, 0)
        if n >= held:
            return 0
        node = self._deepest(seq)
        freed = 0
        while node is not self.root and node.end > n:
            parent = node.parent
            assert parent is not None
            if node.depth < n:  # keep the part before n
                node = self._split(node, n - node.depth).children[
                    (node.scope, node.tokens[n - node.depth])
                ]
                parent = node.parent
                assert parent is not None
            node.holders.discard(seq)
            if not node.holders:
                del parent.children[(node.scope, node.tokens[0])]
                freed += len(node.tokens)
            node = parent
        self.cells -= freed
        if n:
            self._paths[seq] = n
        else:
            del self._paths[seq]
        return freed

    def freed_by_truncate(self, seq: int, n: int) -> int:
        """The cells truncate(seq, n) would free, without cutting anything."""
        freed, node = 0, self._deepest(seq)
        while node is not self.root and node.end > n:
            if node.holders == {seq}:
                freed += node.end - max(node.depth, n)
            assert node.parent is not None
            node = node.parent
        return freed

    def remove(self, seq: int) -> int:
        """seq leaves the tree; returns the cells freed."""
        return self.truncate(seq, 0)

    def _deepest(self, seq: int) -> Node:
        """The last node of seq's path."""
        node = self.root
        while True:
            nxt = next((c for c in node.children.values() if seq in c.holders), None)
            if nxt is None:
                return node
            node = nxt

    def path(self, seq: int) -> list[int]:
        """The tokens seq holds, read back from the tree."""
        out: list[int] = []
        node = self.root
        while True:
            nxt = next((c for c in node.children.values() if seq in c.holders), None)
            if nxt is None:
                return out
            out += nxt.tokens
            node = nxt

    def shared_cells(self) -> int:
        """Cells held by more than one sequence (what seq_cp saved)."""
        total, stack = 0, list(self.root.children.values())
        while stack:
            node = stack.pop()
            if len(node.holders) > 1:
                total += len(node.tokens)
            stack += node.children.values()
        return total

    def runs(self) -> list[Node]:
        """Every node, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack += node.children.values()
        return out
