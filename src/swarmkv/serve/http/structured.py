"""A request's structured-output fields, as the clients agents use send them, to one Constraint.

| field                                     | whose            | constraint                  |
|-------------------------------------------|------------------|-----------------------------|
| `response_format: {"type": "json_object"}`| OpenAI           | any JSON object             |
| `response_format: {"type": "json_schema", | OpenAI           | the schema (always enforced,|
|   "json_schema": {"schema": ...}}`        |                  | `strict` or not)            |
| `json_schema`                             | llama-server     | the schema                  |
| `grammar`                                 | llama-server     | GBNF, by llama.cpp          |
| `guided_json`, `guided_regex`,            | vLLM             | schema, regex, one of a     |
| `guided_choice`, `guided_grammar`         |                  | list, llguidance's Lark     |

A request may carry one of them: two are a 400 naming both, as is a schema or grammar that
does not compile, before anything is queued (code `invalid_constraint`).
`response_format: {"type": "text"}` is none.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from ...llama.constraint import Constraint
from .errors import APIError

CODE = "invalid_constraint"


def refused(param: str, message: str) -> APIError:
    """The 400 of a structured-output field that cannot apply."""
    return APIError(400, message, param=param, code=CODE)


def constraint_of(body: Any) -> tuple[str, Constraint] | None:
    """body's one constraint (validated) and the field that carried it, None without;
    APIError 400 naming the field."""
    found = [(param, c) for param, c in _given(body) if c is not None]
    if len(found) > 1:
        names = " and ".join(p for p, _ in found)
        raise refused(found[1][0], f"give one structured-output field, not {names}")
    if not found:
        return None
    param, constraint = found[0]
    try:
        constraint.validate()
    except ConfigError as exc:
        raise refused(param, f"{param}: {exc}") from None
    return param, constraint


def _given(body: Any) -> list[tuple[str, Constraint | None]]:
    return [
        ("response_format", _response_format(body.response_format)),
        ("json_schema", _schema("json_schema", body.json_schema)),
        ("grammar", _text(Constraint.gbnf, body.grammar)),
        ("guided_json", _schema("guided_json", body.guided_json)),
        ("guided_regex", _text(Constraint.regex, body.guided_regex)),
        (
            "guided_choice",
            None if body.guided_choice is None else Constraint.choice(body.guided_choice),
        ),
        ("guided_grammar", _text(Constraint.grammar, body.guided_grammar)),
    ]


def _text(make: Callable[[str], Constraint], text: str | None) -> Constraint | None:
    return None if text is None else make(text)


def _response_format(fmt: Any) -> Constraint | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        # llama-server's extension: a schema beside json_object
        if fmt.schema_ is None:
            return Constraint.json_object()
        return Constraint.json_schema(fmt.schema_)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise refused(
            "response_format", 'response_format: type "json_schema" needs json_schema.schema'
        )
    return Constraint.json_schema(fmt.json_schema.schema_)


def _schema(param: str, schema: Any) -> Constraint | None:
    if schema is None:
        return None
    if isinstance(schema, str):  # vLLM takes the schema's JSON text too
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise refused(param, f"{param}: not JSON: {exc}") from None
    if not isinstance(schema, dict | bool):
        raise refused(param, f"{param}: a JSON schema is an object")
    return Constraint.json_schema(schema)
