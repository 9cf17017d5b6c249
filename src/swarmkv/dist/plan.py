"""Which worker runs which branches: pure Python, no Ray.

Branches that read each other's text (`after` naming another branch) must run on the same
worker, so the unit of placement is a connected group of branches; groups go to workers
largest first, each to the worker with the fewest branches so far (ties: the lowest index).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError
from ..pipeline.nodes import BranchNode


def branch_groups(branches: Sequence[BranchNode]) -> list[list[BranchNode]]:
    """Branches joined by `after` edges between branches, each group in the given order."""
    names = {b.name for b in branches}
    parent = {b.name: b.name for b in branches}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for b in branches:
        for dep in b.after:
            if dep in names:
                parent[root(b.name)] = root(dep)
    groups: dict[str, list[BranchNode]] = {}
    for b in branches:
        groups.setdefault(root(b.name), []).append(b)
    return list(groups.values())


def assign(branches: Sequence[BranchNode], n_workers: int) -> list[list[BranchNode]]:
    """Each worker's branches (some lists may be empty when groups are fewer than workers)."""
    if n_workers < 1:
        raise ConfigError(f"workers must be >= 1, got {n_workers}")
    shares: list[list[BranchNode]] = [[] for _ in range(n_workers)]
    order = {b.name: i for i, b in enumerate(branches)}
    for group in sorted(branch_groups(branches), key=len, reverse=True):
        target = min(range(n_workers), key=lambda w: (len(shares[w]), w))
        shares[target].extend(group)
    # a worker's branches in the caller's order, so results read like a local run's
    return [sorted(share, key=lambda b: order[b.name]) for share in shares]
