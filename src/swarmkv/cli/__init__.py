"""The `swarmkv` command: one module per command (run and the parser in `main`, demo, info,
snapshot), and the output formatting they share. Pure until a command runs.
"""

from __future__ import annotations

from .app import build_parser, main

__all__ = ["build_parser", "main"]
