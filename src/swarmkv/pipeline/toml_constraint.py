"""A branch's output constraint as a pipeline file gives it, in [settings] (every branch's
that sets none) or in one [[branch]]: one of these keys.

    json_schema = { type = "object", properties = { ... } }   # an inline table
    json_schema_file = "schema.json"       # relative to the TOML file's folder
    json_object = true                     # any JSON object
    regex = "[0-9]{4}-[0-9]{2}-[0-9]{2}"
    choice = ["yes", "no"]
    grammar = 'start: "a" | "b"'           # llguidance's Lark-like syntax; or grammar_file
    gbnf = 'root ::= "a" | "b"'            # llama.cpp's GBNF; or gbnf_file

Two of them, a file that cannot be read, or a schema, regex or grammar that does not compile
is a ConfigError naming the table and key. (A GBNF grammar is parsed against the model's
vocabulary before the prefill, as Pipeline.run does for every branch.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..llama.constraint import Constraint

# key -> how its value becomes a Constraint (a file key's value is the file's text)
_MAKERS: dict[str, Callable[[Any], Constraint]] = {
    "json_schema": Constraint.json_schema,
    "json_schema_file": Constraint.json_schema,
    "regex": Constraint.regex,
    "choice": Constraint.choice,
    "grammar": Constraint.grammar,
    "grammar_file": Constraint.grammar,
    "gbnf": Constraint.gbnf,
    "gbnf_file": Constraint.gbnf,
}
FILE_KEYS = ("json_schema_file", "grammar_file", "gbnf_file")
KEYS = (*_MAKERS, "json_object")


def pop_constraint(values: dict[str, Any], base_dir: Path, where: str) -> Constraint | None:
    """The constraint among values' keys (removed from values), validated; None without."""
    given = [k for k in KEYS if k in values]
    if len(given) > 1:
        raise ConfigError(f"{where}: give one constraint key, not {' and '.join(given)}")
    if not given:
        return None
    key = given[0]
    value = values.pop(key)
    if key == "json_object":
        if value is not True:
            raise ConfigError(f"{where}: 'json_object' is true or absent, got {value!r}")
        constraint = Constraint.json_object()
    else:
        if key in FILE_KEYS:
            value = _read(base_dir / Path(value).expanduser(), where, key)
        constraint = _MAKERS[key](value)
    try:
        constraint.validate()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {key!r}: {exc}") from None
    return constraint


def _read(path: Path, where: str, key: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"{where}: {key!r}: cannot read {path}: {why}") from None


def constraint_from_file(key: str, path: Path, where: str) -> Constraint:
    """A constraint of key's kind (json_schema_file, grammar_file, gbnf_file) from a file,
    validated (for `swarmkv run --json-schema FILE` and its siblings)."""
    constraint = _MAKERS[key](_read(path, where, key))
    try:
        constraint.validate()
    except ConfigError as exc:
        raise ConfigError(f"{where} {path}: {exc}") from None
    return constraint
