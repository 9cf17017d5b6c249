"""What a branch's output must match: a JSON schema, any JSON object, a regular expression, one
of a list of strings, a Lark-like grammar (llguidance's) or a GBNF grammar (llama.cpp's).

Plain data, validated before anything is prefilled: every kind but GBNF is compiled by
llguidance here, so a malformed schema, a keyword llguidance does not implement, a regex that
does not parse or an empty choice list is a ConfigError naming the problem. A GBNF grammar
is parsed by llama.cpp's own grammar sampler, which needs the model's vocabulary: the
engine's sampler raises its error (swarmkv.llama.batch.Sampler) before the branch decodes,
and `swarmkv.llama.guide.check_constraint` does so before a prefill.

Applied by swarmkv.llama.guide (llguidance's matcher masks a branch's logits row) and by the
sampler chain (GBNF).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

# kind -> what its text holds
KINDS: dict[str, str] = {
    "json_schema": "a JSON schema (JSON text)",
    "json_object": "any JSON object (no text)",
    "regex": "a regular expression the whole output matches",
    "choice": "a JSON list of the strings the output may be",
    "grammar": "a grammar in llguidance's Lark-like syntax",
    "gbnf": "a GBNF grammar (llama.cpp's format), from its rule `root`",
}


@dataclass(frozen=True)
class Constraint:
    """One constraint on a branch's output (see KINDS); build it with the class methods."""

    kind: str
    text: str = ""

    # -- the ways to make one ---------------------------------------------------------------
    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str | bool) -> Constraint:
        """Output that is JSON valid under schema (a dict, or its JSON text)."""
        if isinstance(schema, str):
            return cls("json_schema", schema)
        try:
            return cls("json_schema", json.dumps(schema))  # key order is output order
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"json_schema: not JSON-serializable: {exc}") from None

    @classmethod
    def json_object(cls) -> Constraint:
        """Output that is one JSON object, any keys (OpenAI's `json_object`)."""
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Output that the regular expression matches, whole (Rust `regex` syntax)."""
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: Iterable[str]) -> Constraint:
        """Output that is exactly one of options."""
        if isinstance(options, str):
            raise ConfigError("choice: give a list of strings, not one string")
        return cls("choice", json.dumps(list(options), ensure_ascii=False))

    @classmethod
    def grammar(cls, lark: str) -> Constraint:
        """Output in the language of a grammar in llguidance's Lark-like syntax (rule `start`)."""
        return cls("grammar", lark)

    @classmethod
    def gbnf(cls, text: str) -> Constraint:
        """Output in the language of a GBNF grammar (rule `root`), applied by llama.cpp."""
        return cls("gbnf", text)

    # -- what it is ---------------------------------------------------------------------------
    @property
    def by_llguidance(self) -> bool:
        """Whether llguidance applies it (every kind but GBNF, which llama.cpp's sampler does)."""
        return self.kind != "gbnf"

    def describe(self) -> str:
        """A short label for logs and errors: the kind and the start of its text."""
        head = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return f"{self.kind} {head!r}" if self.text else self.kind

    def validate(self) -> None:
        """ConfigError naming the problem: an unknown kind, text that is not a string or not
        UTF-8, or (but for GBNF) a grammar llguidance cannot compile."""
        if self.kind not in KINDS:
            kinds = ", ".join(KINDS)
            raise ConfigError(f"unknown constraint kind {self.kind!r}; choose one of {kinds}")
        if not isinstance(self.text, str):
            got = type(self.text).__name__
            raise ConfigError(f"{self.kind}: the text must be a string, got {got}")
        if self.kind != "json_object" and not self.text.strip():
            raise ConfigError(f"{self.kind}: the text is empty")
        try:
            self.text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"{self.kind}: the text is not UTF-8 ({exc.reason})") from None
        if self.by_llguidance:
            llguidance_grammar(self.kind, self.text)

    def llguidance_grammar(self) -> str:
        """The grammar llguidance's LLMatcher takes (validated); not for GBNF."""
        if not self.by_llguidance:
            raise ConfigError("a GBNF grammar is applied by llama.cpp's sampler, not llguidance")
        return llguidance_grammar(self.kind, self.text)


@functools.lru_cache(maxsize=256)
def llguidance_grammar(kind: str, text: str) -> str:
    """kind's text compiled to an llguidance grammar and validated (cached: many branches of
    one run often share a schema); ConfigError with llguidance's message otherwise."""
    from llguidance import LLMatcher  # only a constrained branch needs it

    grammar = _to_grammar(LLMatcher, kind, text)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConfigError(f"{kind}: {messages[0].strip()}")
    return grammar


def _to_grammar(matcher: Any, kind: str, text: str) -> str:
    if kind == "json_object":
        return str(matcher.grammar_from_json_schema({"type": "object"}))
    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"json_schema: not JSON: {exc}") from None
        return _schema_grammar(matcher, schema)
    if kind == "regex":
        return str(matcher.grammar_from_regex(text))
    if kind == "choice":
        return str(matcher.grammar_from_lark(_choice_lark(text)))
    return str(matcher.grammar_from_lark(text))  # "grammar"


def _schema_grammar(matcher: Any, schema: Any) -> str:
    if schema is True:  # JSON Schema's "anything": llguidance takes options on objects only
        schema = {}
    if schema is False:
        raise ConfigError("json_schema: the schema `false` accepts no value")
    if not isinstance(schema, dict):
        raise ConfigError(f"json_schema: a schema is an object, got {type(schema).__name__}")
    # no whitespace between tokens: one spelling per value (as compact as JSON gets)
    options = {"whitespace_flexible": False}
    try:
        return str(matcher.grammar_from_json_schema(schema, overrides=options))
    except (ValueError, TypeError) as exc:  # e.g. an integer wider than 64 bits
        raise ConfigError(f"json_schema: {exc}") from None


def _choice_lark(text: str) -> str:
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"choice: not a JSON list: {exc}") from None
    if not isinstance(options, list) or not options:
        raise ConfigError("choice: the list of strings is empty")
    for option in options:
        if not isinstance(option, str) or not option:
            raise ConfigError(f"choice: every option must be a non-empty string, got {option!r}")
    # a JSON string literal is a Lark string literal (llguidance reads JSON escapes)
    return "start: " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)
