"""The `swarmkv` command end to end on the default model (Gemma 3 270M), as a user runs it.

Each call is a fresh `python -m swarmkv` process. They run with one thread: on a small shared
machine a second llama.cpp thread that loses its core stalls every decode, and these tests
check behaviour, not speed (the demo's speedup is structural: baseline prefills twice).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.proc import run, swarmkv_cmd

pytestmark = pytest.mark.model

DOC = """\
The lighthouse on Gull Point was built in 1874 from granite quarried two miles inland. Its
lamp stands 31 metres above the sea and can be seen from 22 nautical miles away on a clear
night. For ninety years three keepers lived in the cottages beside the tower and took turns
to watch the light through the night, winding the clockwork that turned the lens every four
hours. The last keeper, Thomas Brennan, left in 1964, when the light was converted to run on
electricity and controlled by radio from the harbour office in Kelham. Today the cottages are
a small museum, open from April to October, where visitors can see the original brass lens,
the keepers' logbooks and a model of the wreck of the schooner Mary Ellen, which ran aground
on the point in 1869 and led the town to petition for a light.
"""
QUESTIONS = [
    "\nQuestion: When was the lighthouse built?\nAnswer:",
    "\nQuestion: Who was the last keeper?\nAnswer:",
]
MODES = ("host", "fork", "device", "baseline")
TIMEOUT_S = 180  # a generous bound: a hang fails the test instead of the whole session


def swarmkv(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(swarmkv_cmd(*args), cwd=cwd, timeout=TIMEOUT_S)


def run_json(*args: str, cwd: Path) -> dict[str, Any]:
    proc = swarmkv(*args, "--json", "-t", "1", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)  # exactly one JSON object on stdout
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli")
    (path / "doc.txt").write_text(DOC, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def by_mode(workdir: Path) -> dict[str, dict[str, Any]]:
    branches = [a for q in QUESTIONS for a in ("--branch", q)]
    return {
        mode: run_json("run", "--doc", "doc.txt", *branches, "--mode", mode, "-n", "8", cwd=workdir)
        for mode in MODES
    }


@pytest.mark.parametrize("mode", MODES)
def test_run_json_in_every_mode(by_mode: dict[str, dict[str, Any]], mode: str) -> None:
    out = by_mode[mode]
    assert out["mode"] == mode
    assert out["model"].endswith(".gguf")
    assert 150 <= out["prefix_tokens"] <= 260
    assert out["prefill_ms"] > 0 and out["e2e_ms"] > 0
    assert (out["snapshot_bytes"] > 0) == (mode == "host")
    assert [b["name"] for b in out["branches"]] == ["b1", "b2"]
    for b, prompt in zip(out["branches"], QUESTIONS, strict=True):
        assert b["prompt"] == prompt
        assert isinstance(b["text"], str) and 1 <= len(b["tokens"]) <= 8
        assert b["activation_ms"] >= 0 and b["decode_ms"] > 0
        assert (b["restore_ms"] is None) == (mode == "baseline")


@pytest.mark.parametrize("mode", ["host", "fork", "device"])
def test_answers_are_token_identical_to_the_baseline(
    by_mode: dict[str, dict[str, Any]], mode: str
) -> None:
    got, baseline = (by_mode[m]["branches"] for m in (mode, "baseline"))
    assert [b["tokens"] for b in got] == [b["tokens"] for b in baseline]


@pytest.fixture(scope="module")
def snapshot_file(workdir: Path) -> Path:
    """doc.txt's snapshot, created by its own process."""
    out = run_json("snapshot", "create", "--doc", "doc.txt", "-o", "doc.swkv", cwd=workdir)
    assert out["file_bytes"] == (workdir / "doc.swkv").stat().st_size > out["state_bytes"]
    assert 150 <= out["tokens"] <= 260 and out["prefill_capture_ms"] > 0
    return workdir / "doc.swkv"


@pytest.mark.slow
def test_snapshot_info_describes_the_file(snapshot_file: Path, workdir: Path) -> None:
    proc = swarmkv("snapshot", "info", snapshot_file.name, "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert (info["checksum"], info["this_build"], info["format_version"]) == ("ok", "compatible", 2)
    assert info["model_name"].endswith(".gguf") and info["context"]["batch_invariant"] is True
    text = swarmkv("snapshot", "info", snapshot_file.name, cwd=workdir).stdout
    assert "checksum    ok" in text and "tokens" in text


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["host", "fork"])
def test_run_from_a_snapshot_in_another_process_answers_like_the_document(
    by_mode: dict[str, dict[str, Any]], snapshot_file: Path, workdir: Path, mode: str
) -> None:
    branches = [a for q in QUESTIONS for a in ("--branch", q)]
    out = run_json(
        "run", "--snapshot", snapshot_file.name, *branches, "--mode", mode, "-n", "8", cwd=workdir
    )
    assert out["reused_tokens"] == out["prefix_tokens"] == by_mode["baseline"]["prefix_tokens"]
    got, ref = out["branches"], by_mode["baseline"]["branches"]
    assert [b["tokens"] for b in got] == [b["tokens"] for b in ref]


@pytest.mark.slow
def test_a_longer_document_reuses_the_snapshot(snapshot_file: Path, workdir: Path) -> None:
    more = DOC + "\nThe lighthouse still stands, and visitors climb it every summer.\n"
    (workdir / "more.txt").write_text(more, encoding="utf-8")
    args = ("--branch", QUESTIONS[1], "-n", "8", "--mode", "fork")
    reuse = run_json(
        "run", "--snapshot", snapshot_file.name, "--doc", "more.txt", *args, cwd=workdir
    )
    alone = run_json("run", "--doc", "more.txt", *args, cwd=workdir)
    assert 0 < reuse["reused_tokens"] < reuse["prefix_tokens"] == alone["prefix_tokens"]
    assert reuse["branches"][0]["tokens"] == alone["branches"][0]["tokens"]
    text = swarmkv(
        "run", "--snapshot", snapshot_file.name, "--doc", "more.txt", *args, "-t", "1", cwd=workdir
    )
    assert f"reused {reuse['reused_tokens']} of them from the snapshot" in text.stdout


@pytest.mark.slow
def test_run_pipeline_toml_with_a_watermark(workdir: Path) -> None:
    (workdir / "pipeline.toml").write_text(
        '[settings]\nmode = "host"\nn_predict = 32\n\n'
        '[document]\nname = "lighthouse"\npath = "doc.txt"\n\n'
        '[[branch]]\nname = "early"\nprompt = "\\nQuestion: When was it built?\\nAnswer:"\n'
        "required_prefix_tokens = 40\n\n"
        '[[branch]]\nname = "late"\nprompt = "\\nQuestion: Who was the last keeper?\\nAnswer:"\n'
        'stop = ["\\n"]\n',
        encoding="utf-8",
    )
    # from another folder: the document path is relative to the TOML file, not the cwd
    out = run_json("run", str(workdir / "pipeline.toml"), "-n", "6", cwd=workdir.parent)
    assert out["mode"] == "host"
    early, late = out["branches"]
    assert early["name"] == "early" and early["prefix_tokens"] == 40
    assert late["prefix_tokens"] == out["prefix_tokens"] > 40
    assert len(early["tokens"]) <= 6  # -n overrides [settings] n_predict
    assert out["nodes"]["lighthouse"]["status"] == "ok"


@pytest.mark.slow
def test_demo_json_reports_a_speedup(workdir: Path) -> None:
    out = run_json("demo", cwd=workdir)
    assert out["ok"] is True
    assert out["fork"]["mode"] == "fork" and out["baseline"]["mode"] == "baseline"
    assert out["prefix_tokens"] > 500
    assert set(out["identical"]) == {"q1", "q2"}
    assert out["speedup"] > 1.0, out["speedup"]


def test_missing_doc_file_is_exit_code_2(workdir: Path) -> None:
    proc = swarmkv("run", "--doc", "missing.txt", "--branch", " Q", cwd=workdir)
    assert proc.returncode == 2
    assert "error" in proc.stderr and "missing.txt" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
