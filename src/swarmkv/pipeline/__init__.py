"""Pipelines: a document and its branches as a spec (Python or TOML), validated once, run as
a DAG of prefill and branch work in one of the handoff modes, with per-branch results.

`Pipeline` (builder.py) loads the native binding on first use; the spec, TOML, DAG, modes and
results modules are pure and import without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .builder import Pipeline


def __getattr__(name: str) -> Any:
    if name != "Pipeline":
        raise AttributeError(f"module 'swarmkv.pipeline' has no attribute {name!r}")
    return importlib.import_module(".builder", __name__).Pipeline


__all__ = ["Pipeline"]
