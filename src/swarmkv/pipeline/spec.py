"""PipelineSpec: a document and the branches that read it, validated in one place.

Pipeline.run (the Python API) and pipeline_toml (TOML files and `swarmkv run`) both describe
a pipeline as a PipelineSpec and call validate() before any model is loaded or context made,
so a spec is judged by the same rules whichever way it was written. Pure Python.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, DagError, SwarmKVWarning
from ..llama.config import LLAMA_MAX_SEQ
from .dag import Dag
from .modes import MODES
from .nodes import BranchNode, PrefillNode

DEFAULT_MODE = "fork"

SHARED_CONTEXT_MODES = ("fork", "device")


def check_sequences(mode: str, n_branches: int, n_batch: int | None) -> None:
    """fork and device put the document and every branch in one context, each a sequence:
    ConfigError when llama.cpp's limits (256 sequences, n_batch output rows) cannot hold
    them, before any model is loaded."""
    if mode not in SHARED_CONTEXT_MODES:
        return
    need = n_branches + 1
    if need > LLAMA_MAX_SEQ:
        raise ConfigError(
            f"{mode} mode keeps the document and all {n_branches} branches in one context, "
            f"{need} sequences, but llama.cpp allows {LLAMA_MAX_SEQ}: use host mode or at most "
            f"{LLAMA_MAX_SEQ - 1} branches"
        )
    if n_batch is not None and need > n_batch:
        raise ConfigError(
            f"{mode} mode needs n_batch >= {need} (one output row per sequence: the document "
            f"and {n_branches} branches), got n_batch={n_batch}"
        )


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
        check_sequences(self.mode, len(self.branches), None)
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
            _check_placeholders(b, names)
            shape.add(b.name, lambda n: None, after=b.after or (doc,))
        order = shape.order()  # unknown names in after, self-edges and cycles
        by_name = {b.name: b for b in self.branches}
        return [by_name[n] for n in order if n in by_name]


def _check_placeholders(b: BranchNode, names: list[str]) -> None:
    """The brace rules of a prompt (docs/guide/prompts.md): `{x}` with x in after must be
    a branch; `{x}` naming a branch left out of after is an error (almost surely meant as its
    text); any other `{word}` stays literal, with a warning in case it is a typo."""
    for ph in b.placeholders():
        if ph not in names:  # the document's name in after: no text to put there
            raise ConfigError(
                f"branch {b.name!r}: prompt uses {{{ph}}}, which is not a branch; "
                f"write {{{{{ph}}}}} for the literal text"
            )
    for word in b.stray_fields():
        if word in names:
            raise ConfigError(
                f"branch {b.name!r}: prompt uses {{{word}}}, but {word!r} is not in its "
                f"after=: add it there to use that branch's text, or write {{{{{word}}}}} "
                "for the literal text"
            )
        # a spec is validated again before each run: Python's warnings filter shows each
        # message once (the default action), without a registry of our own
        warnings.warn(
            f"branch {b.name!r}: {{{word}}} names no upstream branch in after=, so it stays "
            "as literal text",
            SwarmKVWarning,
            stacklevel=2,
        )
