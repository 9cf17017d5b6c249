"""Placing branches on Ray workers (swarmkv.dist.plan) and the missing-ray error: pure Python."""

from __future__ import annotations

import sys

import pytest

from swarmkv.dist import assign, branch_groups
from swarmkv.errors import ConfigError
from swarmkv.pipeline.nodes import BranchNode


def node(name: str, *after: str) -> BranchNode:
    return BranchNode.from_options(name, prompt=f" {name}:", after=("doc", *after))


def names(groups: list[list[BranchNode]]) -> list[list[str]]:
    return [[b.name for b in g] for g in groups]


def test_branches_that_read_each_other_form_one_group() -> None:
    bs = [node("a"), node("b"), node("c", "a"), node("d", "c"), node("e"), node("f", "b", "e")]
    assert names(branch_groups(bs)) == [["a", "c", "d"], ["b", "e", "f"]]


def test_independent_branches_are_dealt_out_evenly_in_order() -> None:
    bs = [node(f"q{i}") for i in range(7)]
    shares = names(assign(bs, 2))
    assert shares == [["q0", "q2", "q4", "q6"], ["q1", "q3", "q5"]]
    assert sorted(n for share in shares for n in share) == sorted(b.name for b in bs)


def test_a_group_stays_on_one_worker_and_the_largest_goes_first() -> None:
    bs = [node("x"), node("a"), node("b", "a"), node("c", "b"), node("y")]
    shares = names(assign(bs, 2))
    assert ["a", "b", "c"] in shares  # the chain is never split
    assert sorted(map(len, shares)) == [2, 3]


def test_more_workers_than_groups_leaves_some_idle() -> None:
    shares = assign([node("a"), node("b", "a")], 3)
    assert names(shares) == [["a", "b"], [], []]


def test_workers_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="workers must be >= 1"):
        assign([node("a")], 0)


def test_missing_ray_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from swarmkv.dist.fanout import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install '\.\[dist\]'"):
        import_ray()
