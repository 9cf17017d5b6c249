"""Faults found by probing the installed build as a user would: each bad value is refused
where it enters, with a message that names it, before any model loads or native call.

1. SWARMKV_MODEL naming a directory (or nothing) is reported as such, not as a 0 MiB model.
2. and 3. Every numeric `swarmkv bench` option is checked at argument parsing (exit 2).
4. `swarmkv bench --doc` a missing file: one line naming it, exit 2, no traceback.
5. Integer settings past their C type (int32) are refused naming the key.
6. A TOML file that starts with a UTF-8 byte-order mark loads like the same file without it.

CLI runs pass `-m` a path that does not exist, so a check that ran only after the model
load would fail with "model file not found" instead of its own message.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from swarmkv.cli.app import main, parse_args
from swarmkv.errors import ConfigError, ModelLoadError
from swarmkv.llama.config import ContextConfig
from swarmkv.llama.install_info import default_model
from swarmkv.llama.models import default_model_path
from swarmkv.llama.sampling import SamplerConfig
from swarmkv.pipeline.toml import load_pipeline_spec

NO_MODEL = "/nonexistent/model.gguf"
BIG = 2**63 - 1  # TOML's largest integer
INT32_MAX = 2**31 - 1  # llama.cpp's int32_t counts: n_batch, n_ctx, top_k


@pytest.fixture
def doc(tmp_path: Path) -> str:
    path = tmp_path / "doc.txt"
    path.write_text("A short document about lighthouses.\n")
    return str(path)


# -- 1. SWARMKV_MODEL naming a directory or nothing ------------------------------------------


def test_info_says_the_model_path_is_a_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # `SWARMKV_MODEL=/tmp swarmkv info` showed "/tmp (0.0 MiB)" as the default model
    monkeypatch.setenv("SWARMKV_MODEL", str(tmp_path))
    facts = default_model()
    assert facts["path"] is None and facts["bytes"] is None
    assert f"SWARMKV_MODEL is a directory, not a GGUF model file: {tmp_path}" in facts["error"]
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("default model"))
    assert "unavailable: SWARMKV_MODEL is a directory" in line and str(tmp_path) in line
    assert "MiB" not in line and "(?)" not in line
    assert main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["default_model"]["path"] is None


def test_info_says_the_model_file_is_not_found(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "missing.gguf"
    monkeypatch.setenv("SWARMKV_MODEL", str(missing))
    assert default_model()["error"] == f"model file not found: {missing} (from SWARMKV_MODEL)"
    assert main(["info"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("default model"))
    assert line.split(None, 2)[2] == (
        f"unavailable: model file not found: {missing} (from SWARMKV_MODEL)"
    )


def test_loading_the_default_model_from_a_directory_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, doc: str
) -> None:
    monkeypatch.setenv("SWARMKV_MODEL", str(tmp_path))
    with pytest.raises(ModelLoadError, match="SWARMKV_MODEL is a directory") as exc:
        default_model_path()
    assert str(tmp_path) in str(exc.value)
    # a run without -m loads the default model: the same error, exit 2
    assert main(["run", "--doc", doc, "--branch", " Q"]) == 2
    err = capsys.readouterr().err
    assert f"SWARMKV_MODEL is a directory, not a GGUF model file: {tmp_path}" in err


def test_a_model_file_named_by_swarmkv_model_is_used_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(2**20))
    monkeypatch.setenv("SWARMKV_MODEL", str(model))
    assert default_model_path() == model
    assert default_model() == {"path": str(model), "bytes": 4 + 2**20}


# -- 2. and 3. numeric `swarmkv bench` options, checked at argument parsing ------------------


def _bench_parse_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What argparse printed when `swarmkv bench ARGS` was refused (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        parse_args(["bench", *args])
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--trials", "0", "argument --trials: value must be >= 1, got 0"),
        ("--trials", "-1", "argument --trials: value must be >= 1, got -1"),
        ("--trials", "1.5", "argument --trials: not an integer: '1.5'"),
        ("--warmup", "-1", "argument --warmup: value must be >= 0, got -1"),
        ("--reference-trials", "0", "argument --reference-trials: value must be >= 1, got 0"),
        ("--n-predict", "0", "argument -n/--n-predict: value must be >= 1, got 0"),
        ("--threads", "0", "argument -t/--threads: value must be >= 1, got 0"),
        ("--threads", "513", "argument -t/--threads: value must be <= 512, got 513"),
        ("--ctx-size", "0", "argument -c/--ctx-size: value must be >= 1, got 0"),
        ("--ctx-size", str(2**31), f"argument -c/--ctx-size: value must be <= {INT32_MAX}"),
        ("--branches", "0", "argument --branches: value must be >= 1, got 0"),
        ("--branches", "2,x", "argument --branches: not a comma list of integers: '2,x'"),
        ("--branches", ",", "argument --branches: not a comma list of integers: ','"),
        ("--doc-tokens", "-5", "argument --doc-tokens: value must be >= 1, got -5"),
        ("--agents", "0", "argument --agents: value must be >= 1, got 0"),
        ("--rates", "0", "argument --rates: value must be > 0, got 0"),
        ("--rates", "2,-1", "argument --rates: value must be > 0, got -1"),
        ("--rates", "nan", "argument --rates: value must be a finite number, got nan"),
        ("--rates", "inf", "argument --rates: value must be a finite number, got inf"),
        ("--rates", "fast", "argument --rates: not a comma list of numbers: 'fast'"),
        ("--n-range", "0,4", "argument --n-range: value must be >= 1, got 0"),
        ("--n-range", "8,4", "argument --n-range: give MIN,MAX with MIN <= MAX, got '8,4'"),
        ("--n-range", "4", "argument --n-range: give MIN,MAX with MIN <= MAX, got '4'"),
        ("--seed", "-1", "argument --seed: value must be >= 0, got -1"),
    ],
)
def test_bench_refuses_nonsense_numbers_at_parsing(
    capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    # --trials 0 (or -1) used to run and report "all 0 checked trials equal", exit 0
    assert message in _bench_parse_error(capsys, option, value)


@pytest.mark.parametrize(("value", "message"), [
    ("0", "argument --max-live: value must be >= 1, got 0"),
    # the bench keeps one document resident beside the live branches: 256 sequences in all
    ("256", "argument --max-live: value must be <= 255, got 256"),
])  # fmt: skip
def test_bench_swarm_max_live_is_checked_up_front(
    capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    # --max-live 0 was refused only by the swarm, after the host-lock system had run
    assert message in _bench_parse_error(capsys, "--swarm", "--max-live", value)
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--swarm", "--max-live", value, "-m", NO_MODEL])
    assert exc.value.code == 2


def test_bench_defaults_and_good_values_parse_to_numbers() -> None:
    args = parse_args(["bench"])
    assert (args.branches, args.doc_tokens) == ([2], [3501])
    assert (args.rates, args.n_range) == ([2.0], (32, 32))
    args = parse_args(
        ["bench", "--warmup", "0", "--trials", "1", "--branches", "1,2,4", "--rates", "0.5,2",
         "--n-range", "4,8", "--max-live", "255", "--seed", "0", "-t", "512"]
    )  # fmt: skip
    assert (args.warmup, args.trials, args.branches, args.rates) == (0, 1, [1, 2, 4], [0.5, 2.0])
    assert (args.n_range, args.max_live, args.seed, args.threads) == ((4, 8), 255, 0, 512)


# -- 4. `swarmkv bench --doc` a file that is not there ---------------------------------------


def _bench(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, str]:
    pytest.importorskip("matplotlib")  # else the bench refuses first, naming its extra
    code = main(["bench", *args, "-m", NO_MODEL, "--out", str(tmp_path / "out")])
    return code, capsys.readouterr().err


def test_bench_doc_that_does_not_exist(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent.txt"
    code, err = _bench(capsys, tmp_path, "--doc", str(missing))
    # the same line `swarmkv run --doc` prints, before the model loads
    assert code == 2
    assert err == f"swarmkv: error: prefill 'doc': document file not found: {missing}\n"


def test_bench_doc_that_is_a_directory_or_not_utf8(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = _bench(capsys, tmp_path, "--doc", str(tmp_path))
    assert code == 2 and f"document path is a directory: {tmp_path}" in err
    binary = tmp_path / "doc.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    code, err = _bench(capsys, tmp_path, "--doc", str(binary))
    assert code == 2 and f"document {binary} is not UTF-8 text" in err
    assert "Traceback" not in err and "model file not found" not in err


# -- 5. integer settings past their C type ----------------------------------------------------


def _toml(tmp_path: Path, settings: str = "", branch: str = "") -> Path:
    path = tmp_path / "p.toml"
    path.write_text(
        f'[settings]\n{settings}\n[document]\ntext = "A short document."\n'
        f'[[branch]]\nname = "q"\nprompt = " Q"\n{branch}\n'
    )
    return path


@pytest.mark.parametrize("key", ["n_batch", "ctx_size", "n_predict"])
@pytest.mark.parametrize("value", [BIG, 2**31])
def test_toml_settings_past_int32_name_the_key(tmp_path: Path, key: str, value: int) -> None:
    # n_batch = 9223372036854775807 failed as a node with cffi's "does not fit '32-bit int'"
    path = _toml(tmp_path, f"{key} = {value}")
    with pytest.raises(ConfigError) as exc:
        load_pipeline_spec(path)
    assert str(exc.value) == f"{path}: [settings]: {key!r} must be <= {INT32_MAX}, got {value}"


def test_toml_settings_at_int32_max_are_taken(tmp_path: Path) -> None:
    spec = load_pipeline_spec(_toml(tmp_path, f"n_batch = {INT32_MAX}\nctx_size = {INT32_MAX}"))
    assert (spec.settings.n_batch, spec.settings.ctx_size) == (INT32_MAX, INT32_MAX)


def test_toml_top_k_past_int32_names_the_branch_and_key(tmp_path: Path) -> None:
    # top_k = 2**63-1 with temperature > 0 failed in llama_sampler_init_top_k (int32_t k)
    path = _toml(tmp_path, branch=f"temperature = 0.5\ntop_k = {BIG}")
    with pytest.raises(ConfigError, match=rf"branch 'q': top_k must be <= {INT32_MAX}, got {BIG}"):
        load_pipeline_spec(path)


def test_run_flags_past_int32_are_refused_before_loading(
    capsys: pytest.CaptureFixture[str], doc: str
) -> None:
    code = main(["run", "--doc", doc, "--branch", " Q", "-c", str(2**31), "-m", NO_MODEL])
    err = capsys.readouterr().err
    assert code == 2 and f"ctx_size must be <= {INT32_MAX}, got {2**31}" in err, err


def _model_stub() -> Any:
    """What ContextConfig.validate reads of a Model, for a model that takes any n_ctx."""
    return SimpleNamespace(
        n_ctx_train=2**40,
        path=Path("stub.gguf"),
        n_swa=0,
        repack=False,
        repacked_without_invariance=(),
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n_ctx", 2**31, f"n_ctx must be <= {INT32_MAX}, got {2**31}"),
        ("n_batch", BIG, f"n_batch must be <= {INT32_MAX}, got {BIG}"),
        ("n_batch", 2**32, f"n_batch must be <= {INT32_MAX}, got {2**32}"),
        ("n_ctx", "4096", "n_ctx must be an integer, got '4096' (str)"),
        ("n_batch", 512.0, "n_batch must be an integer, got 512.0 (float)"),
        ("n_batch", True, "n_batch must be an integer, got True (bool)"),
        ("n_ubatch", "8", "n_ubatch must be an integer, got '8' (str)"),
        ("n_seq_max", 2.0, "n_seq_max must be an integer, got 2.0 (float)"),
        ("n_threads", 1.5, "n_threads must be an integer, got 1.5 (float)"),
        ("n_threads_batch", "2", "n_threads_batch must be an integer, got '2' (str)"),
    ],
)
def test_context_config_integers_are_checked_before_any_native_call(
    field: str, value: object, message: str
) -> None:
    config = ContextConfig(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as exc:
        config.validate(_model_stub())
    assert str(exc.value) == message


def test_context_config_at_int32_max_passes() -> None:
    ContextConfig(n_ctx=INT32_MAX, n_batch=INT32_MAX, n_ubatch=INT32_MAX).validate(_model_stub())


def test_sampler_top_k_is_bounded_by_int32() -> None:
    SamplerConfig(temperature=0.5, top_k=INT32_MAX).validate()
    with pytest.raises(ConfigError, match=rf"top_k must be <= {INT32_MAX}, got {2**31}"):
        SamplerConfig(temperature=0.5, top_k=2**31).validate()


# -- 6. a TOML file that starts with a byte-order mark ---------------------------------------


def test_toml_file_with_a_utf8_bom_loads_like_the_same_file_without(tmp_path: Path) -> None:
    # editors on Windows save UTF-8 with a BOM; tomllib refuses it ("Invalid statement")
    (tmp_path / "doc.txt").write_text("A short document.\n")
    body = (
        '[settings]\nmode = "host"\nn_batch = 64\n[document]\npath = "doc.txt"\n'
        '[[branch]]\nname = "q"\nprompt = " Q"\nn_predict = 4\n'
    )
    plain, bom = tmp_path / "plain.toml", tmp_path / "bom.toml"
    plain.write_text(body, encoding="utf-8")
    bom.write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
    with_bom, without = load_pipeline_spec(bom), load_pipeline_spec(plain)
    assert with_bom.source == bom
    assert (with_bom.document, with_bom.branches, with_bom.settings) == (
        without.document,
        without.branches,
        without.settings,
    )
    assert with_bom.settings.mode == "host" and with_bom.settings.n_batch == 64


def test_a_bom_inside_a_toml_file_is_still_an_error(tmp_path: Path) -> None:
    # only the leading mark is an encoding signature; anywhere else it is a character
    path = tmp_path / "p.toml"
    path.write_bytes(b'[document]\ntext = "Doc."\n\xef\xbb\xbf[[branch]]\nname = "q"\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_pipeline_spec(path)


def test_bench_overhead_only_needs_serve(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = _bench(capsys, tmp_path, "--overhead-only")
    assert code == 2
    assert (
        err == "swarmkv: error: --overhead-only is an option of --serve (the HTTP overhead probe)\n"
    )
