"""A family of small JSON schemas, all different, for constrained-branch runs: schema k asks
for `n_fields` fields drawn from FIELDS in an order and a choice of its own, every field
required and no other allowed. Deterministic: the same k gives the same schema every run.
"""

from __future__ import annotations

import itertools
from typing import Any

# name -> (the field's schema, how the prompt asks for it)
FIELDS: dict[str, tuple[dict[str, Any], str]] = {
    "title": ({"type": "string", "maxLength": 60}, "the document's title"),
    "author": ({"type": "string", "maxLength": 40}, "its author"),
    "year": ({"type": "integer", "minimum": 1000, "maximum": 2100}, "the year it was written"),
    "pages": ({"type": "integer", "minimum": 1, "maximum": 5000}, "its length in pages"),
    "language": ({"enum": ["English", "French", "German", "Other"]}, "its language"),
    "fiction": ({"type": "boolean"}, "whether it is fiction"),
    "score": ({"type": "number", "minimum": 0, "maximum": 10}, "a score out of 10"),
    "summary": ({"type": "string", "maxLength": 80}, "a one-line summary"),
    "place": ({"type": "string", "maxLength": 40}, "where it is set"),
    "people": (
        {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
        "up to three people it names",
    ),
}


def field_schema(k: int, n_fields: int = 5) -> dict[str, Any]:
    """The k-th schema of the family: n_fields of FIELDS (k picks which and their order)."""
    if not 1 <= n_fields <= len(FIELDS):
        raise ValueError(f"n_fields must be in [1, {len(FIELDS)}], got {n_fields}")
    names = _pick(k, n_fields)
    return {
        "type": "object",
        "properties": {n: FIELDS[n][0] for n in names},
        "required": names,
        "additionalProperties": False,
    }


def field_prompt(schema: dict[str, Any]) -> str:
    """A question asking for the schema's fields, in their order, as JSON."""
    asks = ", ".join(f"{n} ({FIELDS[n][1]})" for n in schema["properties"])
    return f"\n\nQuestion: give {asks} as one JSON object.\nAnswer: "


def _pick(k: int, n: int) -> list[str]:
    """The k-th ordered choice of n names: combinations first, then a rotation of each."""
    names = list(FIELDS)
    combos = list(itertools.combinations(names, n))
    combo = list(combos[(k * 37) % len(combos)])  # a stride coprime to 252: spread, distinct
    turn = (k // len(combos)) % n
    return combo[turn:] + combo[:turn]
