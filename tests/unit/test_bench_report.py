"""report.md: the command, setup, tables, speedups, targets, loud fidelity mismatches, plots."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from swarmkv_bench.metrics import speedups, summarize
from swarmkv_bench.records import TrialRecord
from swarmkv_bench.report import Target, write_report
from swarmkv_bench.synthetic import synthetic_records

from support.samples import PROVENANCE

CFG = "N2-doc3501-p32"
COMMAND = "swarmkv bench --trials 3 --doc-tokens 3501 --branches 2 --out results/run1"
SETUP = {
    "model": "gemma-3-270m-it-Q4_K_M.gguf",
    "llama_cpp_commit": "b6a1f2e",
    "threads": 8,
    "cpu": "AMD EPYC 7B13",
    "gpu": "none",
    "kv_dtype": "f16",
    "swa_full": True,
    "flash_attn": False,
    "n_ctx": 4096,
    "note": "a|b",
}


def render(
    tmp_path: Path,
    records: list[TrialRecord],
    targets: Sequence[Target] = (),
    limitations: Sequence[str] = ("one machine, CPU only",),
    plots: Sequence[Path] = (),
) -> str:
    sums = summarize(records)
    path = write_report(
        tmp_path / "out" / "report.md",
        SETUP,
        sums,
        speedups(sums),
        records,
        targets,
        list(limitations),
        list(plots),
        COMMAND,
    )
    return path.read_text(encoding="utf-8")


def hand_records() -> list[TrialRecord]:
    def rec(mode: str, trial: int, e2e: float, act: tuple[float, float], **kw: Any) -> TrialRecord:
        return TrialRecord(
            config_id="N2",
            n_branches=2,
            doc_tokens=3501,
            n_predict=32,
            mode=mode,
            trial=trial,
            e2e_ms=e2e,
            activation_ms=act,
            tokens_generated=64,
            **kw,
        )

    return [
        rec("baseline", 1, 100.0, (30.0, 60.0), prefill_ms=25.0),
        rec("fork", 1, 40.0, (2.0, 4.0), prefill_ms=24.0, fidelity_ok=True),
        rec("baseline", 2, 110.0, (32.0, 64.0), prefill_ms=26.0),
        rec("fork", 2, 50.0, (3.0, 5.0), prefill_ms=26.0, fidelity_ok=True),
        rec("baseline", 3, 130.0, (34.0, 62.0), prefill_ms=27.0),
        rec("fork", 3, 45.0, (4.0, 6.0), prefill_ms=25.0, fidelity_ok=True),
    ]


def test_report_states_the_command_and_setup(tmp_path: Path) -> None:
    text = render(tmp_path, synthetic_records())
    assert text.startswith("# SwarmKV benchmark report")
    assert f"```\n{COMMAND}\n```" in text
    for key, value in SETUP.items():
        if key != "note":
            assert f"| {key} | {value} |" in text
    assert "| note | a\\|b |" in text  # a pipe in a value must not break the table
    assert "| swarmkv_commit | not recorded |" in text


def test_main_table_has_medians_ranges_and_one_decimal(tmp_path: Path) -> None:
    text = render(tmp_path, hand_records())
    assert "### N2: N=2 branches, 3501 document tokens, n_predict=32" in text
    # baseline e2e 100/110/130 -> 110.0 [100.0–130.0], IQR 15.0; best 100.0; prefill 26.0;
    # activation[1] 60/62/64 -> 62.0 [60.0–64.0]; 64 tokens in 110 ms -> 581.8 tokens/s.
    assert (
        "| baseline | 3 | 110.0 [100.0–130.0] | 15.0 | 100.0 | 26.0 | 62.0 [60.0–64.0] "
        "| – | – | – | 581.8 | – | reference |"  # no first_token_ms recorded: shown missing
    ) in text
    assert "| fork | 3 | 45.0 [40.0–50.0] | 5.0 | 40.0 | 25.0 | 5.0 [4.0–6.0] |" in text
    assert "| fork | 3.0 [2.0–4.0] | 5.0 [4.0–6.0] |" in text  # per-branch activation table
    assert "ok 3/3" in text


def test_speedup_table(tmp_path: Path) -> None:
    text = render(tmp_path, hand_records())
    # e2e 110/45 = 2.44; activation[1] 62/5 = 12.40, [0] 32/3 = 10.67; prefill 26*2 - 25 = 27.
    assert "| N2 | fork | baseline | 2.44× | 12.40× | 10.67–12.40 | 27.0 |" in text


def test_targets_table_passes_and_fails(tmp_path: Path) -> None:
    targets = [
        Target("speedup_activation[1]", 12.4, 10.0, ">=", "x", "seed paper: 20x"),
        Target("restore_ms fork", 3.25, 1.0, "<=", "ms"),
        Target("peak RSS", None, 1024.0, "<=", "MiB", "not sampled"),
    ]
    text = render(tmp_path, hand_records(), targets=targets)
    assert "## Targets" in text
    assert "| speedup_activation[1] | 12.40 x | >= 10.00 x | PASS | seed paper: 20x |" in text
    assert "| restore_ms fork | 3.2 ms | <= 1.0 ms | **FAIL** |  |" in text
    assert "| peak RSS | not measured | <= 1024.00 MiB | **NOT MEASURED** | not sampled |" in text
    assert "1 of 3 targets met." in text


def test_target_semantics() -> None:
    assert Target("a", 2.0, 2.0, ">=").passed and Target("a", 2.0, 2.0, "<=").passed
    assert not Target("a", 1.9, 2.0, ">=").passed and not Target("a", 2.1, 2.0, "<=").passed
    assert not Target("a", None, 2.0, ">=").passed
    assert not Target("a", math.nan, 2.0, "<=").passed
    with pytest.raises(ValueError, match="op"):
        Target("a", 1.0, 2.0, ">")


def test_clean_run_has_no_mismatch_section(tmp_path: Path) -> None:
    text = render(tmp_path, synthetic_records())
    assert "FIDELITY MISMATCH" not in text
    assert "all 8 checked trials equal the baseline's token ids." in text


def test_fidelity_mismatch_is_loud(tmp_path: Path) -> None:
    text = render(tmp_path, synthetic_records(mismatch=(CFG, "fork", 1)))
    assert "## FIDELITY MISMATCH" in text
    head = text.index("## FIDELITY MISMATCH")
    assert head < text.index("## Setup")  # before any number that could be quoted
    assert f"**{CFG} / fork / trial 1**: synthetic: tokens differ" in text
    assert "**MISMATCH 1/3**" in text


def _near_tie(rec: TrialRecord) -> TrialRecord:
    detail = "b2: diverged at step 5 of 32 (got 7, baseline 8): replay matches (near-tie)"
    extra = rec.extra | {"fidelity_near_ties": 1}
    return dataclasses.replace(rec, fidelity_ok=True, fidelity_detail=detail, extra=extra)


def _is(rec: TrialRecord, mode: str, trial: int) -> bool:
    return (rec.mode, rec.trial) == (mode, trial)


def test_near_ties_are_listed_with_or_without_a_mismatch(tmp_path: Path) -> None:
    records = [_near_tie(r) if _is(r, "fork", 2) else r for r in synthetic_records()]
    text = render(tmp_path, records)
    assert "all 8 checked trials equal the baseline's token ids, or diverged only at" in text
    tie = f"- near-tie divergence (allowed, see measuring.md): {CFG} / fork / trial 2: b2:"
    assert tie in text
    records = [_near_tie(r) if _is(r, "fork", 2) else r
               for r in synthetic_records(mismatch=(CFG, "host", 1))]  # fmt: skip
    text = render(tmp_path, records)
    assert "## FIDELITY MISMATCH" in text and tie in text
    assert text.index(tie) < text.index("## Setup")


def test_a_peer_only_mismatch_is_said_to_be_the_servers(tmp_path: Path) -> None:
    def peer_differs(rec: TrialRecord) -> TrialRecord:
        if not _is(rec, "server-np1", 1):
            return rec
        return dataclasses.replace(rec, fidelity_ok=False, fidelity_detail="b1: diverged")

    text = render(tmp_path, [peer_differs(r) for r in synthetic_records()])
    assert "## FIDELITY MISMATCH" in text
    assert "all of them llama-server peers'" in text and "This is a bug" not in text
    assert f"**{CFG} / server-np1 / trial 1**: b1: diverged" in text
    ours = [peer_differs(r) for r in synthetic_records(mismatch=(CFG, "fork", 2))]
    assert "This is a bug" in render(tmp_path, ours)  # one of SwarmKV's own: a bug


def test_plots_are_linked_relative_to_the_report(tmp_path: Path) -> None:
    plot = tmp_path / "out" / "plots" / "e2e.png"
    text = render(tmp_path, synthetic_records(), plots=[plot])
    assert "![e2e](plots/e2e.png)" in text


def test_limitations_are_listed(tmp_path: Path) -> None:
    text = render(tmp_path, synthetic_records(), limitations=["no GPU", "one document"])
    tail = text[text.index("## Limitations") :]
    assert "- no GPU" in tail and "- one document" in tail


def test_without_a_reference_mode_there_are_no_speedups(tmp_path: Path) -> None:
    records = [r for r in synthetic_records() if r.mode != "baseline"]
    text = render(tmp_path, records)
    assert "No reference mode was run, so no speedups." in text
    assert "No targets were given for this run." in text


def test_main_table_shows_both_activation_definitions(tmp_path: Path) -> None:
    records = synthetic_records()
    text = render(tmp_path, records)
    assert "| branch_activation_ms[1] | first_token_ms[1] | first_token_ms[last] |" in text
    fork = summarize(records)["N2-doc3501-p32", "fork"]
    last = fork.first_token_ms[-1]
    assert last is not None
    row = next(line for line in text.splitlines() if line.startswith("| fork | 3 |"))
    assert f"{last.median:.1f} [{last.min:.1f}–{last.max:.1f}]" in row


def test_the_report_states_where_it_came_from(tmp_path: Path) -> None:
    sums = summarize(hand_records())
    path = write_report(
        tmp_path / "report.md",
        {**SETUP, "provenance": PROVENANCE},
        sums,
        speedups(sums),
        hand_records(),
        (),
        [],
        [],
        COMMAND,
    )
    text = path.read_text(encoding="utf-8")
    section = text.split("## Provenance", 1)[1].split("\n## ", 1)[0]
    assert "- date: 2026-12-02T03:00:00+00:00" in section
    assert "- CPU: AMD EPYC (family 25, model 17), 2 logical cores" in section
    assert f"sha256 {'ab' * 32}" in section
    assert "| provenance |" not in text  # not repeated in the setup table
    assert "## Provenance\n\n- not recorded" in render(tmp_path, hand_records())
