"""PipelineSpec: a document and the branches that read it, validated in one place.

Pipeline.run (the Python API) and pipeline_toml (TOML files and `swarmkv run`) both describe
a pipeline as a PipelineSpec and call validate() before any model is loaded or context made,
so a spec is judged by the same rules whichever way it was written. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .dag import Dag
from .errors import ConfigError, DagError
from .modes import MODES
from .nodes import BranchNode, PrefillNode

DEFAULT_MODE = "fork"


@dataclass(frozen=True)
class PipelineSpec:
    """The shared document, its branches (in the order given) and the handoff mode."""

    document: PrefillNode | None
    branches: tuple[BranchNode, ...]
    mode: str = DEFAULT_MODE
    source: Path | None = None  # the file it came from, named in messages

    def validate(self) -> list[BranchNode]:
        """Check everything that needs no model; return the branches in topological order.

        Raises ConfigError (DagError, a subclass, for graph faults) naming the first fault: an
        unknown mode, no document, no branch, a duplicate name, a bad branch field
        (BranchNode.validate), a {placeholder} that is not an upstream branch listed in
        after, an unknown name in after, a self-edge or a cycle.
        """
        label = f"{self.source}: " if self.source is not None else ""
        if self.mode not in MODES:
            raise ConfigError(
                f"{label}unknown mode {self.mode!r}; choose one of {', '.join(MODES)}"
            )
        if self.document is None:
            raise ConfigError(f"{label}pipeline has no document: call prefill() first")
        if not self.branches:
            raise ConfigError(f"{label}pipeline has no branches: call branch() at least once")
        try:
            return self._ordered(self.document.name)
        except ConfigError as exc:
            if not label:
                raise
            raise ConfigError(f"{label}{exc}") from exc  # a file's faults name the file

    def _ordered(self, doc: str) -> list[BranchNode]:
        names = [b.name for b in self.branches]
        shape = Dag()
        shape.add(doc, lambda n: None)
        for b in self.branches:
            if b.name == doc or names.count(b.name) > 1:
                raise DagError(f"duplicate node name {b.name!r}")
            b.validate()
            for ph in b.placeholders():
                if ph not in b.after or ph not in names:
                    raise ConfigError(
                        f"branch {b.name!r}: prompt uses {{{ph}}}; it must name "
                        "an upstream branch listed in after="
                    )
            shape.add(b.name, lambda n: None, after=b.after or (doc,))
        order = shape.order()  # unknown names in after, self-edges and cycles
        by_name = {b.name: b for b in self.branches}
        return [by_name[n] for n in order if n in by_name]
