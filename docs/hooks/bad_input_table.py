"""mkdocs hook: the table of docs/reference/bad-input.md, generated at build time.

The rows are the `CASES` list of tests/native/bad_input_cases.py, the cases that
tests/native/test_bad_input_table.py runs, so the page lists exactly what the tests check.
The module is imported by file path; at its top level it imports only the standard library,
and building `CASES` only makes closures, so nothing here loads swarmkv's native code or runs
a case (checked below: a build that would load the binding fails instead).

A page holding the marker line `<!-- bad-input-table -->` gets the table in its place.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = "<!-- bad-input-table -->"
REPO = Path(__file__).resolve().parents[2]
CASES_FILE = REPO / "tests" / "native" / "bad_input_cases.py"
MODULE_NAME = "_swarmkv_docs_bad_input_cases"
NATIVE = "swarmkv._native"


def load_cases(path: Path = CASES_FILE) -> list[Any]:
    """The CASES list of the bad-input module at path, imported by file path."""
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"bad_input_table: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    native_before = NATIVE in sys.modules
    # dataclasses look the module up in sys.modules while its classes are made
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise PluginError(f"bad_input_table: importing {path} failed: {exc!r}") from exc
    finally:
        sys.modules.pop(MODULE_NAME, None)
    if not native_before and NATIVE in sys.modules:
        raise PluginError(
            f"bad_input_table: importing {path} loaded {NATIVE}; the docs build must not load "
            "swarmkv's native code (keep that module's top-level imports to the standard library)"
        )
    cases = getattr(module, "CASES", None)
    if not isinstance(cases, list) or not cases:
        raise PluginError(f"bad_input_table: {path} has no non-empty CASES list")
    return cases


CODE_SPAN = re.compile(r"(`+)(?:.+?)(?<!`)\1(?!`)")


def _cell(text: str) -> str:
    """Markdown text for a table cell: one line, pipes outside code spans escaped (the table
    extension already reads a pipe inside a code span as text)."""
    text = " ".join(str(text).split())
    out, end = [], 0
    for m in CODE_SPAN.finditer(text):
        out += [text[end : m.start()].replace("|", "\\|"), m.group(0)]
        end = m.end()
    out.append(text[end:].replace("|", "\\|"))
    return "".join(out)


def _code(text: str) -> str:
    """text as a code span, fenced with more backticks than it holds in a row."""
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def render(cases: list[Any]) -> str:
    """The Markdown table: where | bad input | error | message contains."""
    lines = [
        "| where | bad input | error | message contains |",
        "|---|---|---|---|",
    ]
    for case in cases:
        message = case.message
        shown = _code(" ".join(message.split())) if message else "(none: it works)"
        lines.append(
            f"| {_cell(case.where)} | {_cell(case.what)} | {_cell(case.expect)} | {shown} |"
        )
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker line with the generated table."""
    if MARKER not in markdown:
        return markdown
    table = render(load_cases())
    out = [table if line.strip() == MARKER else line for line in markdown.splitlines()]
    return "\n".join(out) + "\n"
