"""PipelineSpec.validate: the one set of rules for specs from the Python API and TOML files."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmkv.errors import ConfigError, CycleError, DagError
from swarmkv.pipeline.nodes import BranchNode, PrefillNode
from swarmkv.pipeline.spec import PipelineSpec

DOC = PrefillNode("doc", "A document.")


def branch(name: str, prompt: str = " Q", after: tuple[str, ...] = ()) -> BranchNode:
    return BranchNode(name, prompt, after)


def test_returns_branches_in_topological_order() -> None:
    spec = PipelineSpec(
        DOC, (branch("c", " {a} {b}", ("a", "b")), branch("a"), branch("b", " {a}", ("a",)))
    )
    assert [b.name for b in spec.validate()] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        (PipelineSpec(DOC, (branch("a"),), mode="turbo"), ConfigError, "unknown mode 'turbo'"),
        (PipelineSpec(None, (branch("a"),)), ConfigError, "no document"),
        (PipelineSpec(DOC, ()), ConfigError, "no branches"),
        (PipelineSpec(DOC, (branch("a"), branch("a"))), DagError, "duplicate node name 'a'"),
        (PipelineSpec(DOC, (branch("doc"),)), DagError, "duplicate node name 'doc'"),
        (PipelineSpec(DOC, (branch("a", "  "),)), ConfigError, "prompt is empty"),
        (
            PipelineSpec(DOC, (branch("a", " {b}"), branch("b"))),
            ConfigError,
            "uses {b}, but 'b' is not in its after=",
        ),
        (PipelineSpec(DOC, (branch("a", after=("zz",)),)), DagError, "zz"),
        (
            PipelineSpec(DOC, (branch("a", after=("b",)), branch("b", after=("a",)))),
            CycleError,
            "cycle",
        ),
    ],
)
def test_faults_are_named(spec: PipelineSpec, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        spec.validate()


def test_a_file_spec_names_the_file() -> None:
    spec = PipelineSpec(DOC, (branch("a"), branch("a")), source=Path("p.toml"))
    with pytest.raises(ConfigError, match=r"^p\.toml: duplicate node name 'a'"):
        spec.validate()
