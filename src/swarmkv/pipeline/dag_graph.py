"""Graph algorithms of the pipeline DAG: validation, cycle finding, topological order.

Pure functions over {name: node}, where a node lists the names it depends on; dag.py runs
the graph, this module only reasons about its shape.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Protocol

from ..errors import CycleError, DagError


class HasDeps(Protocol):
    """What the graph functions need of a node: the names it depends on."""

    def dep_names(self) -> list[str]:
        """Names of the nodes this node depends on."""
        ...


def validate(nodes: Mapping[str, HasDeps]) -> None:
    """Raise DagError (self-edge, unknown name) or CycleError naming the cycle."""
    for name, node in nodes.items():
        for dep in node.dep_names():
            if dep == name:
                raise DagError(f"node {name!r} depends on itself")
            if dep not in nodes:
                raise DagError(f"node {name!r} depends on unknown node {dep!r}")
    cycle = find_cycle(nodes)
    if cycle is not None:
        raise CycleError(cycle)


def find_cycle(nodes: Mapping[str, HasDeps]) -> list[str] | None:
    """A cycle as ["a", "b", "a"] (each waits for the next), starting at its earliest node."""
    # Iterative DFS: a long chain of nodes must not hit Python's recursion limit.
    index = {name: i for i, name in enumerate(nodes)}
    state: dict[str, int] = {}  # 1: on the current path, 2: fully explored
    for root in nodes:
        if root in state:
            continue
        state[root] = 1
        path, stack = [root], [iter(nodes[root].dep_names())]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                loop = path[path.index(nxt) :]
                first = loop.index(min(loop, key=index.__getitem__))
                loop = loop[first:] + loop[:first]
                return [*loop, loop[0]]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(nodes[nxt].dep_names()))
    return None


def topo_order(nodes: Mapping[str, HasDeps]) -> list[str]:
    """A topological order; among ready nodes the earliest added comes first."""
    names = list(nodes)
    index = {name: i for i, name in enumerate(names)}
    waiting = {name: len(node.dep_names()) for name, node in nodes.items()}
    dependents: dict[str, list[str]] = {name: [] for name in names}
    for name, node in nodes.items():
        for dep in node.dep_names():
            dependents[dep].append(name)
    ready = [index[name] for name in names if waiting[name] == 0]
    order: list[str] = []
    while ready:
        name = names[heapq.heappop(ready)]
        order.append(name)
        for child in dependents[name]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, index[child])
    return order
