"""Unit tests of the CLI's argument parsing and the TOML pipeline loader; no model is loaded.

Every test here stops before native work: a spec is only loaded and checked, and main() is
only called with inputs that fail validation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmkv.cli.app import main, parse_args, spec_from_args, unescape
from swarmkv.cli.demo import demo_summary, format_demo
from swarmkv.cli.output import PrefillBar, format_result
from swarmkv.errors import ConfigError, SnapshotMismatchError
from swarmkv.pipeline.results import BranchResult, NodeOutcome, PipelineResult
from swarmkv.pipeline.toml import (
    BranchSpec,
    DocumentSpec,
    PipelineFile,
    Settings,
    check_spec,
    load_pipeline_spec,
)

VALID = """\
[settings]
mode = "host"
model = "models/m.gguf"
ctx_size = 2048
threads = 2
n_batch = 256
n_predict = 32
temperature = 0

[document]
name = "report"
path = "doc.txt"

[[branch]]
name = "summary"
prompt = "\\nSummary:"
n_predict = 16
required_prefix_tokens = 4

[[branch]]
name = "critic"
prompt = "\\nCritique of {summary}:"
after = ["report", "summary"]
temperature = 0.7
top_k = 40
top_p = 0.9
min_p = 0.05
seed = 7
stop = ["\\n\\n"]
"""


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() configures logging; later tests (the native tier's log tests) need it back."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    levels = {n: logging.getLogger(n).level for n in ("swarmkv", "swarmkv.llama")}
    yield
    root.handlers[:] = handlers
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def write(tmp_path: Path, toml: str, doc: str | None = "A short document.\n") -> Path:
    if doc is not None:
        (tmp_path / "doc.txt").write_text(doc, encoding="utf-8")
    path = tmp_path / "pipeline.toml"
    path.write_text(toml, encoding="utf-8")
    return path


def error_of(tmp_path: Path, toml: str, doc: str | None = "A short document.\n") -> str:
    with pytest.raises(ConfigError) as info:
        load_pipeline_spec(write(tmp_path, toml, doc))
    return str(info.value)


# -- parsing --------------------------------------------------------------------------------
def test_run_defaults() -> None:
    args = parse_args(["run", "--doc", "d.txt", "--branch", "Q1", "--branch", "Q2"])
    assert args.command == "run"
    assert args.doc == "d.txt" and args.branch == ["Q1", "Q2"]
    assert args.pipeline is None
    # None means "not given": a TOML file's [settings] (or the library default) applies
    for key in ("mode", "n_predict", "model", "ctx_size", "threads", "seed", "temp", "exact"):
        assert getattr(args, key) is None, key
    assert args.json is False and args.verbose is False


def test_exact_flag_and_setting_layer(tmp_path: Path) -> None:
    """--exact/--no-exact override [settings] exact; neither given keeps the file's value."""
    path = write(tmp_path, '[settings]\nexact = false\n[document]\ntext = "D."\n'
                 '[[branch]]\nname = "q"\nprompt = " Q"\n')  # fmt: skip
    assert load_pipeline_spec(path).settings.exact is False
    for flags, want in (([], False), (["--exact"], True), (["--no-exact"], False)):
        spec = spec_from_args(parse_args(["run", str(path), *flags]))
        assert spec.settings.exact is want, flags
    assert "'exact' must be true or false" in error_of(
        tmp_path,
        '[settings]\nexact = "yes"\n[document]\ntext = "D."\n'
        '[[branch]]\nname = "q"\nprompt = " Q"\n',
    )


def test_run_flags_long_and_short() -> None:
    args = parse_args(
        [
            "run",
            "--doc",
            "d",
            "--branch",
            "q",
            "--mode",
            "host",
            "-n",
            "8",
            "-m",
            "m.gguf",
            "-c",
            "1024",
            "-t",
            "2",
            "--seed",
            "3",
            "--temp",
            "0.5",
            "--json",
            "-v",
        ]
    )
    assert (args.mode, args.n_predict, args.model, args.ctx_size, args.threads) == (
        "host",
        8,
        "m.gguf",
        1024,
        2,
    )
    assert (args.seed, args.temp, args.json, args.verbose) == (3, 0.5, True, True)


@pytest.mark.parametrize("mode", ["host", "fork", "baseline"])
def test_every_mode_is_a_choice(mode: str) -> None:
    assert parse_args(["run", "--doc", "d", "--branch", "q", "--mode", mode]).mode == mode


@pytest.mark.parametrize(
    "argv",
    [
        [],  # a command is required
        ["run"],  # neither a file nor --doc
        ["run", "--doc", "d.txt"],  # no branch
        ["run", "--branch", "q"],  # no doc
        ["run", "p.toml", "--doc", "d.txt", "--branch", "q"],  # both forms
        ["run", "--doc", "d", "--branch", "q", "--mode", "turbo"],
        ["run", "--doc", "d", "--branch", "q", "-n", "0"],
        ["run", "--doc", "d", "--branch", "q", "-t", "two"],
        ["demo", "--mode", "fork"],  # demo runs both modes; and no --mode -> --model
        ["run", "--doc", "d", "--branch", "q", "--n-pred", "8"],  # no abbreviations
    ],
)
def test_bad_arguments_exit_with_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2


def test_run_with_a_toml_positional_keeps_flags_as_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    args = parse_args(["run", str(path), "--mode", "fork", "-n", "8", "-m", "other.gguf"])
    assert args.pipeline == str(path)
    spec = spec_from_args(args)
    assert spec.mode == "fork"  # the flag beats [settings] mode = "host"
    assert spec.settings.model == Path("other.gguf")
    assert spec.settings.ctx_size == 2048  # not given on the command line: the file's
    summary, critic = spec.branches
    assert spec.branch_kwargs(summary)["n_predict"] == 16  # the branch's own value wins
    assert spec.branch_kwargs(critic)["n_predict"] == 8  # the flag beats [settings]


def test_run_with_doc_names_branches_b1_b2(tmp_path: Path) -> None:
    (tmp_path / "d.txt").write_text("Text.\n", encoding="utf-8")
    spec = spec_from_args(
        parse_args(["run", "--doc", str(tmp_path / "d.txt"), "--branch", "A", "--branch", "B"])
    )
    assert [b.name for b in spec.branches] == ["b1", "b2"]
    assert [b.prompt for b in spec.branches] == ["A", "B"]
    assert spec.mode == "fork"
    assert spec.branch_kwargs(spec.branches[0])["n_predict"] == 64


@pytest.mark.parametrize(
    ("raw", "prompt"),
    [
        ("\\n\\nSummary:", "\n\nSummary:"),  # as typed in a shell: backslash, n
        ("\n\nSummary:", "\n\nSummary:"),  # real newlines stay
        ("a\\tb \\\\n \\x", "a\tb \\n \\x"),  # \\ is one backslash; others stay
    ],
)
def test_branch_prompts_read_backslash_escapes(raw: str, prompt: str) -> None:
    assert unescape(raw) == prompt
    spec = spec_from_args(parse_args(["run", "--doc", "d.txt", "--branch", raw]))
    assert spec.branches[0].prompt == prompt


def test_bench_is_a_subcommand() -> None:
    args = parse_args(["bench", "--paper", "--out", "results"])
    assert args.command == "bench" and args.paper is True


def test_demo_defaults() -> None:
    args = parse_args(["demo"])
    assert (args.command, args.model, args.threads, args.json) == ("demo", None, None, False)


# -- main(): errors before any native work --------------------------------------------------
def test_missing_doc_is_an_error_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--doc", str(tmp_path / "nope.txt"), "--branch", "q"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("swarmkv: error: ") and "not found" in err
    assert "Traceback" not in err


def test_empty_doc_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d.txt").write_text("  \n", encoding="utf-8")
    assert main(["run", "--doc", str(tmp_path / "d.txt"), "--branch", "q"]) == 2
    assert "empty" in capsys.readouterr().err


def test_bad_toml_key_is_reported_by_main(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, VALID.replace("n_predict = 16", "n_predikt = 16"))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "branch[1] 'summary': unknown key 'n_predikt'" in err
    assert "did you mean 'n_predict'" in err


def test_verbose_errors_carry_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--doc", str(tmp_path / "nope.txt"), "--branch", "q", "-v"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "swarmkv: error:" in err


def test_logging_defaults_silence_llama_warnings() -> None:
    main(["run", "--doc", "/nonexistent/d.txt", "--branch", "q"])
    assert logging.getLogger("swarmkv").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("swarmkv.llama").getEffectiveLevel() == logging.ERROR
    main(["run", "--doc", "/nonexistent/d.txt", "--branch", "q", "-v"])
    assert logging.getLogger("swarmkv").getEffectiveLevel() == logging.INFO
    assert logging.getLogger("swarmkv.llama").getEffectiveLevel() == logging.INFO


# -- the TOML loader ------------------------------------------------------------------------
def test_valid_file_loads_without_a_model(tmp_path: Path) -> None:
    # settings.model names a file that does not exist: loading must not try to open it
    spec = load_pipeline_spec(write(tmp_path, VALID))
    assert spec.settings == Settings(
        mode="host",
        model=tmp_path / "models/m.gguf",
        ctx_size=2048,
        threads=2,
        n_batch=256,
        n_predict=32,
        temperature=0.0,
    )
    assert spec.document == DocumentSpec(name="report", path=tmp_path / "doc.txt")
    summary, critic = spec.branches
    assert summary == BranchSpec("summary", "\nSummary:", n_predict=16, required_prefix_tokens=4)
    assert critic.after == ("report", "summary") and critic.stop == ("\n\n",)
    assert (critic.temperature, critic.top_k, critic.top_p, critic.min_p, critic.seed) == (
        0.7,
        40,
        0.9,
        0.05,
        7,
    )
    assert spec.branch_kwargs(critic)["n_predict"] == 32  # from [settings]


def test_document_path_is_relative_to_the_toml_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    path = write(sub, '[document]\npath = "doc.txt"\n[[branch]]\nname = "a"\nprompt = " Q"\n')
    monkeypatch.chdir(tmp_path)  # the working directory has no doc.txt
    spec = load_pipeline_spec(Path("sub") / path.name)
    assert spec.document.path == sub / "doc.txt"
    assert spec.document.node().text == "A short document.\n"


def test_document_text_inline_and_after_as_a_string(tmp_path: Path) -> None:
    toml = '[document]\ntext = "Inline."\n[[branch]]\nname = "a"\nprompt = " Q"\nafter = "doc"\n'
    spec = load_pipeline_spec(write(tmp_path, toml, doc=None))
    assert spec.document == DocumentSpec(text="Inline.")
    assert spec.branches[0].after == ("doc",)
    assert spec.mode == "fork"


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (VALID + "[extra]\nx = 1\n", "top level: unknown key 'extra'"),
        (VALID.replace("threads = 2", "thread = 2"), "[settings]: unknown key 'thread'"),
        (VALID.replace('name = "report"', 'title = "report"'), "[document]: unknown key 'title'"),
        (VALID.replace("seed = 7", "sead = 7"), "branch[2] 'critic': unknown key 'sead'"),
    ],
)
def test_unknown_keys_are_named_with_their_place(tmp_path: Path, toml: str, expected: str) -> None:
    message = error_of(tmp_path, toml)
    assert expected in message
    assert str(tmp_path / "pipeline.toml") in message


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("threads = 2", 'threads = "2"', "[settings]: 'threads' must be an integer"),
        ("ctx_size = 2048", "ctx_size = true", "'ctx_size' must be an integer"),
        ("n_predict = 16", "n_predict = 1.5", "branch[1] 'summary': 'n_predict' must be an integ"),
        ("top_p = 0.9", 'top_p = "high"', "'top_p' must be a finite number"),
        ('stop = ["\\n\\n"]', 'stop = "\\n\\n"', "'stop' must be a list of strings"),
        ('path = "doc.txt"', "path = 3", "[document]: 'path' must be a string"),
        ('mode = "host"', 'mode = "turbo"', "mode must be one of host, fork, device, baseline"),
        ("threads = 2", "threads = 0", "'threads' must be >= 1"),
    ],
)
def test_wrong_types_and_values(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in VALID
    assert expected in error_of(tmp_path, VALID.replace(old, new))


def test_missing_document(tmp_path: Path) -> None:
    toml = '[[branch]]\nname = "a"\nprompt = " Q"\n'
    assert "no [document] table" in error_of(tmp_path, toml)


def test_document_file_must_exist(tmp_path: Path) -> None:
    assert "document file not found" in error_of(tmp_path, VALID, doc=None)


def test_document_with_both_text_and_path(tmp_path: Path) -> None:
    toml = VALID.replace('path = "doc.txt"', 'path = "doc.txt"\ntext = "Inline."')
    assert "give one of 'path' or 'text', not both" in error_of(tmp_path, toml)


def test_document_with_neither_text_nor_path(tmp_path: Path) -> None:
    toml = VALID.replace('path = "doc.txt"', "")
    assert "give one of 'path', 'text' or 'snapshot'" in error_of(tmp_path, toml)


def test_document_snapshot_that_is_not_one_fails_before_the_model(tmp_path: Path) -> None:
    (tmp_path / "not.swkv").write_bytes(b"GGUF" + bytes(60))
    toml = VALID.replace('path = "doc.txt"', 'snapshot = "not.swkv"')
    with pytest.raises(SnapshotMismatchError, match=r"not\.swkv is not a SwarmKV snapshot"):
        load_pipeline_spec(write(tmp_path, toml, "A short document.\n"))


def test_duplicate_branch_names(tmp_path: Path) -> None:
    toml = VALID.replace('name = "critic"', 'name = "summary"').replace("{summary}", "x")
    assert "duplicate node name 'summary'" in error_of(tmp_path, toml)


def test_branch_named_like_the_document(tmp_path: Path) -> None:
    toml = VALID.replace('name = "summary"', 'name = "report"').replace("{summary}", "x")
    assert "duplicate node name 'report'" in error_of(tmp_path, toml)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('name = "summary"', "", "branch[1]: missing required key 'name'"),
        ('prompt = "\\nSummary:"', "", "branch[1] 'summary': missing required key 'prompt'"),
        ('["report", "summary"]', '["report", "summary", "ghost"]', "unknown node 'ghost'"),
        ('["report", "summary"]', '["report"]', "prompt uses {summary}"),
        ("required_prefix_tokens = 4", "required_prefix_tokens = 0", "must be >= 1"),
    ],
)
def test_branch_graph_and_fields(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in VALID
    assert expected in error_of(tmp_path, VALID.replace(old, new))


def test_cycle_between_branches(tmp_path: Path) -> None:
    toml = (
        '[document]\ntext = "Doc."\n'
        '[[branch]]\nname = "a"\nprompt = " A"\nafter = ["b"]\n'
        '[[branch]]\nname = "b"\nprompt = " B"\nafter = ["a"]\n'
    )
    assert "cycle" in error_of(tmp_path, toml, doc=None)


def test_no_branches_and_not_toml(tmp_path: Path) -> None:
    assert "no [[branch]] entries" in error_of(tmp_path, '[document]\ntext = "Doc."\n', doc=None)
    assert "not valid TOML" in error_of(tmp_path, "[document\n", doc=None)
    with pytest.raises(ConfigError, match="cannot read pipeline file"):
        load_pipeline_spec(tmp_path / "missing.toml")


def test_overrides_are_checked_again() -> None:
    spec = PipelineFile(DocumentSpec(text="Doc."), (BranchSpec("b1", " Q"),))
    check_spec(spec)
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        check_spec(spec.with_settings(Settings(temperature=-1.0)))
    with pytest.raises(ConfigError, match="unknown mode"):
        check_spec(spec.with_settings(Settings(mode="turbo")))


# -- output (fabricated results: formatting is pure) -----------------------------------------
def fake_result(mode: str, texts: dict[str, str], e2e_ms: float) -> PipelineResult:
    branches = {
        name: BranchResult(
            name=name,
            prompt=f"\nQuestion {name}?",
            text=text,
            tokens=tuple(range(len(text.split()))),
            stop_reason="length",
            prefix_tokens=100,
            prompt_tokens=5,
            activation_ms=1.0,
            restore_ms=None if mode == "baseline" else 0.5,
            fork_copy_ms=None,
            prefill_ms=None,
            decode_ms=20.0,
            first_token_ms=30.0,
            end_ms=e2e_ms,
        )
        for name, text in texts.items()
    }
    outcomes = {n: NodeOutcome(n, "ok") for n in ["doc", *texts]}
    return PipelineResult(mode, "m.gguf", 100, 512, 40.0, 0, e2e_ms, branches, outcomes)


def test_format_result_shows_answers_and_timings() -> None:
    out = format_result(fake_result("baseline", {"b1": " one\ntwo", "b2": "  "}, 80.0))
    assert "mode baseline" in out and "100 document tokens" in out
    assert "prompt:   '\\nQuestion b1?'" in out
    assert "answer:   one\n            two\n" in out  # continuation lines stay indented
    assert "answer:   (empty)" in out
    assert "prefill_ms 40.0   e2e_ms 80.0" in out
    assert "activation_ms  restore_ms  decode_ms" in out
    assert "b1           2  length            1.0           -       20.0" in out


def test_demo_summary_and_format() -> None:
    fork = fake_result("fork", {"q1": "5.6 metres.", "q2": "A power cut."}, 50.0)
    baseline = fake_result("baseline", {"q1": "5.6 metres.", "q2": "A cut."}, 80.0)
    summary = demo_summary(fork, baseline)
    assert summary["speedup"] == 1.6
    assert summary["identical"] == {"q1": True, "q2": False}
    # without step logits a divergence cannot be shown to be a near-tie: not ok
    assert summary["fidelity_ok"] is False
    out = format_demo(fork, baseline, summary)
    assert "speedup (baseline e2e / fork e2e): 1.60x" in out
    assert "q1: " in out and "tokens equal" in out
    assert "q2: diverged at step" in out
    assert out.count("5.6 metres.") == 2


def test_progress_bar_draws_nothing_when_disabled(capsys: pytest.CaptureFixture[str]) -> None:
    bar = PrefillBar(enabled=False)
    bar(512, 1024)
    bar.close()
    assert capsys.readouterr().err == ""


def test_bench_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    assert main(["bench", "--branches", "1", "--trials", "1"]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "swarmkv[bench]" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_temperature_is_refused_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # --temp nan used to pass validation and return token 262143 with "ok": true
    doc = tmp_path / "doc.txt"
    doc.write_text("A short document.\n")
    code = main(["run", "--doc", str(doc), "--branch", " Q", f"--temp={value}", "-m", "/x"])
    err = capsys.readouterr().err
    assert code == 2
    assert "temperature must be a finite number" in err and "/x" not in err, err


@pytest.mark.parametrize(("key", "value"), [("top_p", "nan"), ("min_p", "inf")])
def test_non_finite_sampling_values_in_toml_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str
) -> None:
    toml = tmp_path / "p.toml"
    toml.write_text(
        f'[document]\ntext = "Doc."\n[[branch]]\nname = "q"\nprompt = " Q"\n{key} = {value}\n'
    )
    assert main(["run", str(toml), "-m", "/nonexistent"]) == 2
    assert f"branch[1] 'q': {key!r} must be a finite number, got float {value}" in (
        capsys.readouterr().err
    )


def test_absurd_thread_count_is_refused_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # -t 3000000000 used to fail inside the prefill node with an empty reason (exit 1)
    doc = tmp_path / "doc.txt"
    doc.write_text("A short document.\n")
    assert main(["run", "--doc", str(doc), "--branch", " Q", "-t", "3000000000", "-m", "/x"]) == 2
    assert "threads must be at most 512" in capsys.readouterr().err


def test_bench_reference_trials_must_fit_the_trials(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert main(["bench", "--trials", "2", "--reference-trials", "3"]) == 2
    err = capsys.readouterr().err
    assert "--reference-trials must be between 1 and --trials (2), got 3" in err
