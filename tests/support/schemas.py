"""JSON schemas for constrained-output tests, drawn by hypothesis from the features agents
use and llguidance implements: typed fields with bounds and lengths, enums and consts,
string formats and patterns, arrays, nested objects, anyOf, optional fields.

Every schema is checked against its draft's meta-schema (jsonschema.check_schema) as it is
drawn, and string lengths and array sizes are bounded so that a complete answer fits in a
few dozen tokens (a field left unbounded is the truncation case the tests also accept).
"""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import strategies as st

NAMES = ["id", "name", "date", "amount", "ok", "city", "tags", "note", "score", "kind", "who"]
# formats the default jsonschema FormatChecker checks without optional packages
FORMATS = ["date", "email", "ipv4", "uuid"]
PATTERNS = [r"[A-Z]{2}[0-9]{3}", r"(yes|no)", r"[a-z]+(-[a-z]+)?"]

Schema = dict[str, Any]


def _integer() -> st.SearchStrategy[Schema]:
    def build(lo: int, span: int) -> Schema:
        return {"type": "integer", "minimum": lo, "maximum": lo + span}

    bounded = st.builds(build, st.integers(-1000, 1000), st.integers(0, 10_000))
    return st.one_of(st.just({"type": "integer"}), bounded)


def _number() -> st.SearchStrategy[Schema]:
    bounded = st.builds(
        lambda lo: {"type": "number", "minimum": lo, "maximum": lo + 100}, st.integers(-50, 50)
    )
    return st.one_of(st.just({"type": "number"}), bounded)


def _string() -> st.SearchStrategy[Schema]:
    sized = st.builds(
        lambda lo, span: {"type": "string", "minLength": lo, "maxLength": lo + span},
        st.integers(0, 3),
        st.integers(1, 24),
    )
    formatted = st.sampled_from(FORMATS).map(lambda f: {"type": "string", "format": f})
    patterned = st.sampled_from(PATTERNS).map(lambda p: {"type": "string", "pattern": f"^{p}$"})
    return st.one_of(sized, formatted, patterned)


def _leaf() -> st.SearchStrategy[Schema]:
    words = st.text("abcdefghijklmnopqrstuvwxyz ", min_size=1, max_size=8)
    return st.one_of(
        _integer(),
        _number(),
        _string(),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.lists(words, min_size=1, max_size=4, unique=True).map(lambda e: {"enum": e}),
        words.map(lambda w: {"const": w}),
    )


def _array(items: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    def build(item: Schema, lo: int, span: int) -> Schema:
        return {"type": "array", "items": item, "minItems": lo, "maxItems": lo + span}

    return st.builds(build, items, st.integers(0, 2), st.integers(0, 3))


@st.composite
def _object(draw: st.DrawFn, values: st.SearchStrategy[Schema]) -> Schema:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    props = {n: draw(values) for n in names}
    required = [n for n in names if draw(st.booleans()) or n == names[0]]
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


def _value(depth: int) -> st.SearchStrategy[Schema]:
    if depth == 0:
        return _leaf()
    inner = _value(depth - 1)
    any_of = st.lists(inner, min_size=2, max_size=3).map(lambda s: {"anyOf": s})
    return st.one_of(_leaf(), _array(inner), _object(inner), any_of)


def _checked(schema: Schema) -> Schema:
    jsonschema.validators.validator_for(schema).check_schema(schema)
    return schema


def schemas() -> st.SearchStrategy[Schema]:
    """Top-level schemas: an object of fields (what an agent asks for), nested at most twice."""
    return _object(_value(1)).map(_checked)


def validator(schema: Schema) -> jsonschema.protocols.Validator:
    """A validator for schema that checks the formats too."""
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)
