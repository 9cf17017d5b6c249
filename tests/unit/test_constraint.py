"""Constraints as data: each kind compiles through llguidance, and each bad one is a
ConfigError naming the problem (no model needed: GBNF is checked against a vocabulary in
the native and model tiers). Then the same constraints from TOML files and `swarmkv run`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from swarmkv import Constraint
from swarmkv.cli.app import parse_args, spec_from_args
from swarmkv.errors import ConfigError
from swarmkv.pipeline.toml import load_pipeline_spec

SCHEMA = {
    "type": "object",
    "properties": {"when": {"type": "string", "format": "date"}, "n": {"type": "integer"}},
    "required": ["when", "n"],
}


@pytest.mark.parametrize(
    "constraint",
    [
        Constraint.json_schema(SCHEMA),
        Constraint.json_schema(json.dumps(SCHEMA)),
        Constraint.json_schema(True),
        Constraint.json_object(),
        Constraint.regex(r"[0-9]{4}-[0-9]{2}"),
        Constraint.choice(["yes", "no", 'a "quoted" one', "ünïcode"]),
        Constraint.grammar('start: "id:" /[a-z]+/'),
        Constraint.gbnf('root ::= "a" | "b"'),  # parsed by llama.cpp, with a vocabulary
    ],
    ids=lambda c: c.kind,
)
def test_each_kind_validates(constraint: Constraint) -> None:
    constraint.validate()
    assert constraint.describe().startswith(constraint.kind)
    if constraint.by_llguidance:
        assert constraint.llguidance_grammar()
    else:
        with pytest.raises(ConfigError, match=r"llama\.cpp's sampler"):
            constraint.llguidance_grammar()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Constraint.json_schema("{not json"), "json_schema: not JSON"),
        (lambda: Constraint.json_schema("[1, 2]"), "a schema is an object, got list"),
        (lambda: Constraint.json_schema(False), "`false` accepts no value"),
        (lambda: Constraint.json_schema({"not": {"type": "string"}}), "json_schema: .*not"),
        (lambda: Constraint.json_schema({"type": "nonsense"}), "json_schema: .*nonsense"),
        (lambda: Constraint.json_schema({"minimum": 10**40}), "json_schema: .*serializable"),
        (lambda: Constraint.json_schema({"x": object()}), "not JSON-serializable"),
        (lambda: Constraint.choice([]), "choice: the list of strings is empty"),
        (lambda: Constraint.choice(["a", ""]), "every option must be a non-empty string"),
        (lambda: Constraint.choice(["a", 3]), "every option must be a non-empty string, got 3"),
        (lambda: Constraint.choice("yes"), "give a list of strings, not one string"),
        (lambda: Constraint("choice", '"yes"'), "the list of strings is empty"),
        (lambda: Constraint.regex("("), "(?s)regex: .*unclosed group"),
        (lambda: Constraint.regex(""), "regex: the text is empty"),
        (lambda: Constraint.grammar("start: ("), "grammar: "),
        (lambda: Constraint.grammar("   "), "grammar: the text is empty"),
        (lambda: Constraint.gbnf(""), "gbnf: the text is empty"),
        (lambda: Constraint.regex("a\ud800"), "regex: the text is not UTF-8"),
        (lambda: Constraint("xml", "<a/>"), "unknown constraint kind 'xml'; choose one of"),
        (lambda: Constraint("regex", 5), "regex: the text must be a string, got int"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_constraint_is_a_config_error(make: Callable[[], Constraint], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make().validate()


def test_schema_keys_keep_their_order() -> None:
    # the output's key order is the schema's: a dict's order survives into the JSON text
    c = Constraint.json_schema({"properties": {"b": {}, "a": {}}})
    assert c.text.index('"b"') < c.text.index('"a"')


# -- TOML ---------------------------------------------------------------------------------
def _toml(tmp_path: Path, branch: str, settings: str = "") -> Path:
    path = tmp_path / "p.toml"
    path.write_text(
        f'[settings]\n{settings}\n[document]\ntext = "D."\n'
        f'[[branch]]\nname = "a"\nprompt = " Q"\n{branch}\n'
        '[[branch]]\nname = "b"\nprompt = " R"\n',
        encoding="utf-8",
    )
    return path


def _constraints(path: Path) -> list[Constraint | None]:
    spec = load_pipeline_spec(path)
    return [spec.branch_kwargs(b)["constraint"] for b in spec.branches]


def test_toml_constraint_keys(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    (tmp_path / "g.lark").write_text('start: "x" | "y"', encoding="utf-8")
    (tmp_path / "g.gbnf").write_text('root ::= "x"', encoding="utf-8")
    cases = {
        'json_schema = { type = "object", properties = { n = { type = "integer" } } }': (
            "json_schema"
        ),
        'json_schema_file = "s.json"': "json_schema",
        "json_object = true": "json_object",
        'regex = "[0-9]+"': "regex",
        'choice = ["yes", "no"]': "choice",
        "grammar = 'start: \"x\"'": "grammar",
        'grammar_file = "g.lark"': "grammar",
        "gbnf = 'root ::= \"x\"'": "gbnf",
        'gbnf_file = "g.gbnf"': "gbnf",
    }
    for line, kind in cases.items():
        mine, other = _constraints(_toml(tmp_path, line))
        assert mine is not None and mine.kind == kind and other is None, line
    c = _constraints(_toml(tmp_path, 'json_schema_file = "s.json"'))[0]
    assert c is not None and json.loads(c.text) == SCHEMA
    # [settings]: every branch's that sets none; a branch's own wins
    mine, other = _constraints(_toml(tmp_path, 'regex = "a+"', settings="json_object = true"))
    assert mine == Constraint.regex("a+") and other == Constraint.json_object()


@pytest.mark.parametrize(
    ("branch", "message"),
    [
        ('regex = "a"\nchoice = ["b"]',
         r"branch\[1\] 'a': give one constraint key, not regex and choice"),
        ('json_schema = "{}"', "'json_schema' must be a table, got str"),
        ("json_object = false", "'json_object' is true or absent"),
        ("choice = []", "'choice': choice: the list of strings is empty"),
        ('choice = "yes"', "'choice' must be a list of strings"),
        ('regex = "("', "'regex': regex: "),
        ('json_schema = { type = "nonsense" }', "'json_schema': json_schema: "),
        ('json_schema = { default = 1979-05-27 }', "not JSON-serializable"),
        ('json_schema_file = "missing.json"', "'json_schema_file': cannot read .*missing.json"),
        ('grammar_file = "missing.lark"', "cannot read"),
        ("regexp = 'a'", "did you mean 'regex'"),
    ],
)  # fmt: skip
def test_toml_constraint_errors(tmp_path: Path, branch: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_pipeline_spec(_toml(tmp_path, branch))


# -- swarmkv run ----------------------------------------------------------------------------
def _run_constraint(tmp_path: Path, *flags: str) -> Constraint | None:
    (tmp_path / "d.txt").write_text("Text.\n", encoding="utf-8")
    args = parse_args(["run", "--doc", str(tmp_path / "d.txt"), "--branch", "A", *flags])
    spec = spec_from_args(args)
    return spec.branch_kwargs(spec.branches[0])["constraint"]


def test_run_flags(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    (tmp_path / "g.lark").write_text('start: "x"', encoding="utf-8")
    (tmp_path / "g.gbnf").write_text('root ::= "x"', encoding="utf-8")
    assert _run_constraint(tmp_path) is None
    for flags, kind in (
        (["--json-schema", str(tmp_path / "s.json")], "json_schema"),
        (["--json-object"], "json_object"),
        (["--regex", "[a-z]+"], "regex"),
        (["--choice", "yes", "--choice", "no"], "choice"),
        (["--grammar", str(tmp_path / "g.lark")], "grammar"),
        (["--gbnf", str(tmp_path / "g.gbnf")], "gbnf"),
    ):
        c = _run_constraint(tmp_path, *flags)
        assert c is not None and c.kind == kind, flags
    assert _run_constraint(tmp_path, "--choice", "yes", "--choice", "no") == Constraint.choice(
        ["yes", "no"]
    )


def test_run_flags_conflict_or_fail(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["run", "--doc", "d", "--branch", "q", "--regex", "a", "--json-object"])
    assert info.value.code == 2
    (tmp_path / "bad.json").write_text("{nope", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"--json-schema .*bad\.json: json_schema: not JSON"):
        _run_constraint(tmp_path, "--json-schema", str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match=r"--grammar.*cannot read"):
        _run_constraint(tmp_path, "--grammar", str(tmp_path / "none.lark"))
    with pytest.raises(ConfigError, match="regex: "):
        _run_constraint(tmp_path, "--regex", "(")
