"""Figures in the docs, tied to the result files they come from.

A measured figure in README.md or a results page is written with an HTML comment right after
it that names its source; the comment is invisible on the rendered page:

    12458.1<!--fig branches/best_run.json#configs/N32-D3501-P32/modes/fork+inv/e2e_ms/median .1f-->
    12458.1 [11666.0-12518.7]<!--spread branches/best_run.json#configs/.../e2e_ms .1f-->

`fig` checks the number just before the comment; `spread` checks "median [min-max]" of a
stat ({median, min, max}, or a [median, min, max] list); `ratio` checks A / B for
PATH = A:B, two values of one file (`<!--ratio FILE#A:B .2f-->`). FILE is relative to
docs/results/. PATH walks the JSON: keys separated by "/" (URL-quoted: %20 for a space, %2F
for a slash), a list element by index (`trials/0`) or by fields' values
(`speedups[mode=fork+inv,baseline_mode=baseline+inv]`), and a list of numbers to its
`@median`, `@min` or `@max` (`tokenize_ms/@median`). FORMAT is a Python format spec.
tests/unit/test_results_docs.py checks every comment against its file, and that every
measured figure (a number with a decimal point) on those pages carries one.

    python -m swarmkv_bench.figures FILE#PATH [FORMAT]    # prints the annotated figure
    python -m swarmkv_bench.figures --refresh PAGE...     # rewrites the pages' figures
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

ANNOTATION = re.compile(r"<!--(fig|spread|ratio) ([^#\s]+)#(\S+) (\S+)-->")
_SELECT = re.compile(r"^(?P<key>[^\[]*)\[(?P<conds>[^\]]+=[^\]]*)\]$")
# a measured figure: digits with a decimal point (config values are integers)
MEASURED = re.compile(r"(?<![\w.])\d[\d,]*\.\d+")
# a statistic of a list of numbers, as a path's step
_STATS: dict[str, Callable[[list[float]], float]] = {
    "@median": statistics.median,
    "@min": min,
    "@max": max,
}


class FigureError(ValueError):
    pass


@lru_cache(maxsize=64)
def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def resolve(root: Path, file: str, path: str) -> Any:
    """The value at PATH in the JSON file root/FILE (see the module docstring)."""
    target = root / file
    if not target.is_file():
        raise FigureError(f"{file}: no such result file under {root}")
    node = _load(target.resolve())
    for raw in path.split("/"):
        step = unquote(raw)
        m = _SELECT.match(step)
        if m:
            items = node[m["key"]] if m["key"] else node
            conds = [c.split("=", 1) for c in m["conds"].split(",")]
            hits = [x for x in items if all(str(x.get(k)) == v for k, v in conds)]
            if len(hits) != 1:
                raise FigureError(f"{file}#{path}: {step} matches {len(hits)} entries")
            node = hits[0]
        elif step in _STATS and isinstance(node, list):
            node = _STATS[step](node)
        elif isinstance(node, list):
            node = node[int(step)]
        elif isinstance(node, dict) and step in node:
            node = node[step]
        else:
            raise FigureError(f"{file}#{path}: no {step!r} there")
    return node


def value_of(root: Path, kind: str, file: str, path: str) -> Any:
    """What a comment names: one value, or for `ratio` the quotient of its two paths."""
    if kind != "ratio":
        return resolve(root, file, path)
    a, sep, b = path.partition(":")
    if not sep:
        raise FigureError(f"{file}#{path}: a ratio names two paths, A:B")
    return resolve(root, file, a) / resolve(root, file, b)


def render(kind: str, value: Any, fmt: str) -> str:
    """The text a figure must read: one number, or "median [min-max]" of a stat."""
    if kind in ("fig", "ratio"):
        return format(value, fmt)
    if isinstance(value, dict):
        parts = (value["median"], value["min"], value["max"])
    else:  # [median, min, max], as the study scripts write spreads
        parts = tuple(value)
    med, lo, hi = (format(x, fmt) for x in parts)
    return f"{med} [{lo}-{hi}]"


def annotate(root: Path, ref: str, fmt: str = ".1f", kind: str = "fig") -> str:
    """`value<!--kind ref fmt-->` for ref = FILE#PATH: what a page writes."""
    file, _, path = ref.partition("#")
    sides = path.split(":") if kind == "ratio" else [path]
    # each key quoted once (a caller may pass %2F for a slash inside a key)
    safe = ":".join(
        "/".join(quote(unquote(p), safe="[]=+-_.,@") for p in side.split("/")) for side in sides
    )
    path = safe
    return f"{render(kind, value_of(root, kind, file, path), fmt)}<!--{kind} {file}#{safe} {fmt}-->"


def check(text: str, root: Path) -> list[str]:
    """Every problem in text: a comment whose file or path is missing, or whose figure does
    not read what the file holds, or a measured figure with no comment."""
    problems: list[str] = []
    checked: list[tuple[int, int]] = []
    for m in ANNOTATION.finditer(text):
        kind, file, path, fmt = m.groups()
        try:
            want = render(kind, value_of(root, kind, file, path), fmt)
        except (FigureError, KeyError, IndexError, TypeError, ValueError) as exc:
            problems.append(f"{m.group(0)}: {exc}")
            continue
        before = text[: m.start()].rstrip("*")
        # the whole figure: "1/8" must not pass for "2/1/8", nor "0.9" for "10.9"
        whole = before.endswith(want) and not _joins(before[: len(before) - len(want)])
        if not whole:
            got = before[-len(want) - 12 :].splitlines()[-1:] or [""]
            problems.append(f"{file}#{path}: the page says ...{got[0]!r}, the file {want!r}")
            continue
        checked.append((len(before) - len(want), len(before)))
    for m in MEASURED.finditer(_blank_code(text)):
        if not any(lo <= m.start() and m.end() <= hi for lo, hi in checked):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"line {line}: {m.group(0)} has no <!--fig/spread--> source")
    return problems


# the figure just before a comment, as each kind writes it (a spread: "median [min-max]")
_NUM = r"-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?%?"
_WRITTEN = {
    "fig": re.compile(_NUM + "$"),
    "ratio": re.compile(_NUM + "$"),
    "spread": re.compile(_NUM + r" \[" + _NUM + "-" + _NUM + r"\]$"),
}


def _words(body: str, want: str) -> re.Match[str] | None:
    """A text figure (format s: "8/8", ">= 0.9") as written before its comment: as many
    words as its new text has."""
    n = max(1, len(want.split()))
    return re.search(r"\S+" + r"\s+\S+" * (n - 1) + "$", body)


def refresh(text: str, root: Path) -> str:
    """text with every annotated figure rewritten to what its file holds now (after a study
    is run again). Only the figures change: the prose around them is the author's to read
    again. A comment whose source cannot be read raises FigureError."""
    out, last = [], 0
    for m in ANNOTATION.finditer(text):
        kind, file, path, fmt = m.groups()
        want = render(kind, value_of(root, kind, file, path), fmt)
        head = text[last : m.start()]
        stars = len(head) - len(head.rstrip("*"))
        body = head[: len(head) - stars]
        old = _WRITTEN[kind].search(body) if fmt != "s" else _words(body, want)
        if old is None:
            raise FigureError(f"{file}#{path}: no figure before its comment")
        out += [body[: old.start()], want, head[len(head) - stars :], m.group(0)]
        last = m.end()
    return "".join(out) + text[last:]


def _joins(prefix: str) -> bool:
    """Whether the text before a figure runs into it (its last character would be part of a
    longer figure: a digit, a slash, a point, a sign)."""
    return bool(prefix) and prefix[-1] in "0123456789/.-+,%"


def _blank_code(text: str) -> str:
    """text with code blocks, code spans, link targets and comments blanked (same length):
    numbers there are commands, paths or sources, not measured figures."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    for pattern in (r"```.*?```", r"`[^`\n]*`", r"\]\([^)]*\)", r"<!--.*?-->"):
        text = re.sub(pattern, blank, text, flags=re.S)
    return text


def main(argv: list[str]) -> int:
    if argv[:1] == ["--refresh"]:  # --refresh PAGE...: rewrite each page's figures in place
        for page in map(Path, argv[1:]):
            page.write_text(refresh(page.read_text(encoding="utf-8"), Path("docs/results")))
        return 0
    if not 1 <= len(argv) <= 3:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path("docs/results")
    fmt = argv[1] if len(argv) > 1 else ".1f"
    kind = argv[2] if len(argv) > 2 else "fig"
    print(annotate(root, argv[0], fmt, kind))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
