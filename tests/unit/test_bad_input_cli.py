"""Bad input found by probing as a new user: each gets a SwarmKVError that names the field
and value, before any model loads. Pure Python: no native library.

CLI runs pass `-m` a path that does not exist, so a check that ran only after the model
load would fail with "model file not found" instead of its own message.
"""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path

import pytest

from swarmkv.checks import check_seconds
from swarmkv.cli.app import main, parse_args, spec_from_args
from swarmkv.cli.output import report_failures
from swarmkv.errors import ConfigError, SwarmKVWarning
from swarmkv.llama.sampling import SamplerConfig
from swarmkv.pipeline.dag import Dag
from swarmkv.pipeline.nodes import BranchNode, PrefillNode
from swarmkv.pipeline.results import NodeOutcome, PipelineResult
from swarmkv.pipeline.spec import PipelineSpec

NO_MODEL = "/nonexistent/model.gguf"


@pytest.fixture
def doc(tmp_path: Path) -> str:
    path = tmp_path / "doc.txt"
    path.write_text("A short document about lighthouses.\n")
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """main()'s exit status and what it wrote to stderr."""
    code = main([*args, "-m", NO_MODEL])
    return code, capsys.readouterr().err


# -- 1. non-finite and negative sampling values ---------------------------------------------


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_sampler_refuses_non_finite_values(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"{field} must be a finite number, got {value}"):
        SamplerConfig(**{field: value}).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -0.5, "temperature must be >= 0, got -0.5"),
        ("top_p", -0.1, r"top_p must be in \[0, 1\], got -0.1"),
        ("min_p", 1.5, r"min_p must be in \[0, 1\], got 1.5"),
        ("top_k", 0, "top_k must be >= 1, got 0"),
        ("seed", -1, r"seed must be in \[0, 2\*\*32\), got -1"),
    ],
)
def test_sampler_refuses_out_of_range_values(field: str, value: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SamplerConfig(**{field: value}).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0, -1, True, "5"])
def test_timeouts_must_be_finite_and_positive(value: object) -> None:
    # a NaN deadline compares false with every time, so the run would never time out
    with pytest.raises(ConfigError, match="timeout_s must be a finite number of seconds > 0"):
        check_seconds("timeout_s", value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout_s"):
        Dag().run(timeout_s=value)  # type: ignore[arg-type]


def test_a_wait_of_zero_seconds_may_poll() -> None:
    check_seconds("timeout", 0, zero_ok=True)
    check_seconds("timeout", 2.5)
    with pytest.raises(ConfigError, match="timeout must be a finite number of seconds >= 0"):
        check_seconds("timeout", -1, zero_ok=True)


# -- 3. fork's limits, checked before the model loads -----------------------------------------


def test_more_branches_than_llama_sequences_in_fork_mode(
    capsys: pytest.CaptureFixture[str], doc: str
) -> None:
    branches = [a for i in range(300) for a in ("--branch", f" Q{i}")]
    code, err = run(capsys, "run", "--doc", doc, *branches)
    assert code == 2
    assert (
        "fork mode keeps the document and all 300 branches in one context, 301 sequences, "
        "but llama.cpp allows 256: use host mode or at most 255 branches"
    ) in err
    assert NO_MODEL not in err
    # host mode gives every branch a context of its own: no such limit, so the run gets as
    # far as the model
    code, err = run(capsys, "run", "--doc", doc, *branches, "--mode", "host")
    assert code == 2 and f"model file not found: {NO_MODEL}" in err


def test_n_batch_below_the_branch_count_in_fork_mode(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    toml = tmp_path / "p.toml"
    toml.write_text(
        '[settings]\nn_batch = 1\n[document]\ntext = "Doc."\n'
        '[[branch]]\nname = "a"\nprompt = " A"\n[[branch]]\nname = "b"\nprompt = " B"\n'
    )
    code, err = run(capsys, "run", str(toml))
    assert code == 2
    assert "fork mode needs n_batch >= 3 (one output row per sequence" in err
    assert "got n_batch=1" in err


def test_a_failed_node_always_has_a_reason() -> None:
    def fails(_ctx: object) -> None:
        raise KeyError()  # str() of it is ""

    dag = Dag()
    dag.add("doc", fails)
    assert dag.run().results["doc"].reason == "KeyError"


def test_the_failure_line_is_never_empty(capsys: pytest.CaptureFixture[str]) -> None:
    outcomes = {
        "doc": NodeOutcome("doc", "failed", None, MemoryError()),
        "q": NodeOutcome("q", "skipped"),
    }
    result = PipelineResult(
        mode="fork",
        model="m",
        prefix_tokens=1,
        n_ctx=16,
        prefill_ms=0.0,
        snapshot_bytes=0,
        e2e_ms=0.0,
        branches={},
        outcomes=outcomes,
    )
    assert report_failures(result) == 1
    assert capsys.readouterr().err.splitlines() == [
        "swarmkv: node 'doc' failed: MemoryError",
        "swarmkv: node 'q' skipped: no reason given",
    ]


# -- 5. thread counts ------------------------------------------------------------------------


@pytest.mark.parametrize("threads", ["1000", "3000000000"])
def test_thread_counts_past_ggmls_limit(
    capsys: pytest.CaptureFixture[str], doc: str, threads: str
) -> None:
    code, err = run(capsys, "run", "--doc", doc, "--branch", " Q", "-t", threads)
    assert code == 2
    assert f"threads must be at most 512 (ggml's limit), got {threads}" in err


def test_thread_count_at_ggmls_limit_gets_to_the_model(
    capsys: pytest.CaptureFixture[str], doc: str
) -> None:
    code, err = run(capsys, "run", "--doc", doc, "--branch", " Q", "-t", "512")
    assert code == 2 and "model file not found" in err


# -- 4. and 6. files, standard input, encodings ----------------------------------------------


def test_doc_that_is_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run(capsys, "run", "--doc", str(tmp_path), "--branch", " Q")
    assert code == 2
    assert f"document path is a directory: {tmp_path}" in err and "not found" not in err


def test_doc_dash_reads_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    stdin = io.TextIOWrapper(io.BytesIO("Un phare à Brest, 1987.\n".encode()), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", stdin)
    spec = spec_from_args(parse_args(["run", "--doc", "-", "--branch", " Q"]))
    assert spec.document.text == "Un phare à Brest, 1987.\n" and spec.document.path is None


def test_doc_dash_with_bytes_that_are_not_utf8(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"ok \xff\xfe")))
    code, err = run(capsys, "run", "--doc", "-", "--branch", " Q")
    assert code == 2
    assert "prefill 'doc': standard input is not UTF-8 text (byte 3: invalid start byte)" in err


def test_doc_file_that_is_not_utf8(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "doc.bin"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    code, err = run(capsys, "run", "--doc", str(path), "--branch", " Q")
    assert code == 2 and f"document {path} is not UTF-8 text (byte 0" in err


def test_prompt_that_cannot_be_utf8(capsys: pytest.CaptureFixture[str], doc: str) -> None:
    # a shell argument with an undecodable byte reaches Python as a lone surrogate
    code, err = run(capsys, "run", "--doc", doc, "--branch", " Q \udcff")
    assert code == 2
    assert "branch 'b1': prompt is not valid UTF-8 text (character 3: surrogates" in err


def test_toml_file_that_is_not_utf8(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    toml = tmp_path / "p.toml"
    toml.write_bytes(b'[document]\ntext = "Doc \xff"\n[[branch]]\nname = "q"\nprompt = " Q"\n')
    code, err = run(capsys, "run", str(toml))
    assert code == 2 and "p.toml: not valid TOML: 'utf-8' codec can't decode byte 0xff" in err


# -- 4. and 7. names and braces in prompts ---------------------------------------------------


def _branch(name: str, prompt: str, *after: str) -> BranchNode:
    return BranchNode(name, prompt, after)


def test_dotted_and_wave_names_are_ordinary_names() -> None:
    # str.format read {q1.summary} as attribute access; fork mode names its internal nodes
    # wave-N once; names such as "wave-9" must stay ordinary names
    spec = PipelineSpec(
        PrefillNode("wave-9", "A document."),
        (
            _branch("q1.summary", " Summary:"),
            _branch("b", " Was {q1.summary} right?", "q1.summary"),
        ),
    )
    b = spec.validate()[1]
    assert b.placeholders() == ["q1.summary"]
    assert b.render({"q1.summary": "it was"}) == " Was it was right?"


@pytest.mark.parametrize(
    ("prompt", "rendered"),
    [
        (' JSON {"a": 1} and {x}:', ' JSON {"a": 1} and {x}:'),  # no placeholder: as written
        (' JSON {"a": {x}} after {s}', ' JSON {"a": {x}} after TEXT'),  # the same with one
        (" {{s}} is {s}", " {s} is TEXT"),  # {{name}} writes {name}
        (" {{word}} {{q1.x}}", " {word} {q1.x}"),  # also for words that name no branch
        (' {{"a": 1}} } { {} {{}}', ' {{"a": 1}} } { {} {{}}'),  # other braces: as written
        (" code: if (x) { return {s}; }", " code: if (x) { return TEXT; }"),
    ],
)
def test_braces_are_literal_except_placeholders(prompt: str, rendered: str) -> None:
    b = _branch("b", prompt, "s")
    PipelineSpec(PrefillNode("doc", "D."), (_branch("s", " S"), b)).validate()
    assert b.render({"s": "TEXT"}) == rendered


def test_a_word_in_braces_that_names_nothing_is_kept_with_one_warning() -> None:
    b = _branch("b", " Answer as {format}:")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("default")  # Python's own filter: once per message and place
        for _ in range(2):  # the CLI validates a spec when loading it and again to run it
            PipelineSpec(PrefillNode("doc", "D."), (b,)).validate()
    seen = [str(w.message) for w in record if issubclass(w.category, SwarmKVWarning)]
    assert len(seen) == 1 and "{format} names no upstream branch" in seen[0]
    assert b.render({}) == " Answer as {format}:"


def test_a_branch_in_braces_but_not_in_after_is_an_error() -> None:
    spec = PipelineSpec(PrefillNode("doc", "D."), (_branch("s", " S"), _branch("b", " {s}?")))
    with pytest.raises(ConfigError, match=r"uses \{s\}, but 's' is not in its after=.*\{\{s\}\}"):
        spec.validate()


def test_the_document_in_braces_is_an_error() -> None:
    spec = PipelineSpec(PrefillNode("doc", "D."), (_branch("b", " {doc}?", "doc"),))
    with pytest.raises(ConfigError, match=r"uses \{doc\}, which is not a branch"):
        spec.validate()
