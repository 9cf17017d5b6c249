"""The report's limitations come from the run, report.docx carries the report with its plots,
and the memory pass puts each mode's own peak RSS on that mode's records."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from swarmkv_bench import memprobe, runner
from swarmkv_bench.docx_report import write_docx
from swarmkv_bench.limitations import limitations
from swarmkv_bench.metrics import summarize
from swarmkv_bench.modes import split_modes
from swarmkv_bench.runner import BenchOptions, BenchRun
from swarmkv_bench.synthetic import synthetic_records
from swarmkv_bench.workload import BenchConfig

CFG = BenchConfig(2, 3501, 32)
SETUP = {"cpu": "Some CPU (2 cores)", "threads": 2, "build": "CPU native", "gpu": "none"}


def _run(**opts: Any) -> BenchRun:
    options = BenchOptions(model_path=Path("m.gguf"), configs=(CFG,), **opts)
    return BenchRun(options, records=synthetic_records(), setup=dict(SETUP))


def test_limitations_are_written_from_the_run() -> None:
    run = _run()
    first = limitations(run, summarize(run.records))
    assert "CPU only (Some CPU (2 cores), 2 threads" in first[0]
    assert any("llama-server" in line for line in first)  # server-np1 ran
    assert not any("host decodes one branch" in line for line in first)  # no waits recorded
    assert not any("checked trials differ" in line or "fewer than the 3" in line for line in first)

    run = _run(trials=1, memory_probe=False)
    run.setup["gpu"] = "NVIDIA H200"
    run.records = [
        dataclasses.replace(r, extra={"wait_ms_max": 12.5 + r.trial}) if r.mode == "host" else r
        for r in synthetic_records(
            modes=("baseline", "host"), mismatch=("N2-doc3501-p32", "host", 2)
        )
    ]
    run.notes.append("a note from the run")
    second = limitations(run, summarize(run.records))
    assert second[0].startswith("Measured with GPU NVIDIA H200")
    assert any("queued up to 15.5 ms" in line for line in second)  # the largest measured wait
    assert any("host in N2-doc3501-p32: 1 of 3 checked trials differ" in s for s in second)
    assert not any("llama-server" in line for line in second)
    assert any("--no-memory-probe" in line for line in second)
    assert any("1 measured trial(s)" in line for line in second)
    assert second[-1] == "a note from the run"


def test_report_docx_holds_headings_tables_bullets_and_the_plots(tmp_path: Path) -> None:
    docx = pytest.importorskip("docx", reason="python-docx is in the test extra")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (tmp_path / "plots").mkdir()
    plt.plot([1, 2], [3, 4])
    plt.savefig(tmp_path / "plots" / "e2e.png")
    plt.close("all")
    md = tmp_path / "report.md"
    md.write_text(
        "# SwarmKV benchmark report\n\nA **bold** claim with `code`.\n\n## Results\n\n"
        "| mode | e2e_ms |\n|---|--:|\n| fork | 12.5 |\n| **host** | 30.0 |\n\n"
        "- a limitation\n\n![e2e](plots/e2e.png)\n\n![missing](plots/none.png)\n",
        encoding="utf-8",
    )
    out = write_docx(md, tmp_path / "report.docx")
    doc = docx.Document(str(out))
    texts = [p.text for p in doc.paragraphs]
    assert texts[0] == "SwarmKV benchmark report" and "Results" in texts
    assert "A bold claim with code." in texts and "a limitation" in texts
    (table,) = doc.tables
    assert [[c.text for c in row.cells] for row in table.rows] == [
        ["mode", "e2e_ms"],
        ["fork", "12.5"],
        ["host", "30.0"],
    ]
    assert len(doc.inline_shapes) == 1  # the plot that exists, embedded


def test_memory_pass_puts_each_modes_own_peak_on_its_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def fake_measure(request: dict[str, Any], cfg: BenchConfig, *work: Any) -> dict[str, Any]:
        asked.append(request["mode"])
        if request["mode"] == "host":
            raise memprobe.SwarmKVError("memory probe of host exited 1: boom")
        return {"peak_rss_bytes": 1000 + len(asked), "model_rss_bytes": 10, "kv_bytes": 5}

    monkeypatch.setattr(memprobe, "measure", fake_measure)
    run = _run()
    run.records = [dataclasses.replace(r, config_id=CFG.config_id) for r in run.records]
    specs, _ = split_modes(["fork", "host"])
    runner._memory_pass(run, CFG, specs, ("doc", ["q1", "q2"]), None)
    assert asked == ["baseline", "fork", "host"]
    peaks = {r.mode: r.peak_rss_bytes for r in run.records}
    assert peaks["baseline"] == 1001 and peaks["fork"] == 1002
    assert peaks["host"] == synthetic_records()[-2].peak_rss_bytes  # probe failed: kept
    assert any("host memory probe failed" in n for n in run.notes)


def test_baselines_run_in_the_first_reference_trials_only() -> None:
    (base, fork), _ = split_modes(["fork"])
    few = BenchOptions(model_path=Path("m"), configs=(CFG,), trials=3, reference_trials=1)
    every = BenchOptions(model_path=Path("m"), configs=(CFG,), trials=3)
    trials = (-1, 0, 1, 2)  # -1: the warm-up
    assert [runner._runs_in(few, base, t) for t in trials] == [False, True, False, False]
    assert all(runner._runs_in(few, fork, t) for t in trials)
    assert all(runner._runs_in(every, base, t) for t in trials)
    run = _run(reference_trials=1)
    assert any("Baselines ran in 1 measured trial" in s for s in limitations(run, {}))


def test_every_steps_logits_are_kept_only_when_a_mode_may_diverge() -> None:
    exact, _ = split_modes(["fork+inv", "host+inv", "fork+exact"])
    loose, _ = split_modes(["fork+inv", "fork"])
    assert runner.logits_kept(exact, CFG) is True  # first step only: less copying timed
    assert runner.logits_kept(loose, CFG) == "all"  # near-ties need every step
    assert runner.logits_kept(loose, BenchConfig(64, 3501, 32)) is True  # memory bound
    run = _run(modes=("fork",))
    kept = [s for s in limitations(run, {}) if "kept every step's logits" in s]
    assert kept and "logit_capture_ms: not recorded" in kept[0]
    captured = {("fork", 1): 150.0, ("fork", 2): 170.0, ("fork", 3): 160.0, ("host", 1): 9.0}
    run.records = [
        dataclasses.replace(r, extra=r.extra | {"logit_capture_ms": captured[(r.mode, r.trial)]})
        if (r.mode, r.trial) in captured and not r.is_warmup else r
        for r in run.records
    ]  # fmt: skip
    kept = [s for s in limitations(run, {}) if "kept every step's logits" in s]
    assert "logit_capture_ms per run, median: fork at 2 160.0 ms, host at 2 9.0 ms" in kept[0]
    run = _run(modes=("fork+inv",))
    assert not any("kept every step's logits" in s for s in limitations(run, {}))


def test_the_floor_table_states_the_hardware_floor_and_its_bound() -> None:
    from swarmkv_bench.floor import floor_markdown, rows_per_step

    records = [
        dataclasses.replace(r, extra={"gen_ms_per_step": 20.0 if r.mode == "host" else 100.0})
        for r in synthetic_records(modes=("host", "fork", "fork+exact"))
    ]
    assert [rows_per_step(records[i]) for i in range(3)] == [1, 2, 1]
    # 1e9 layer multiply-adds and 1e8 output ones per row at 100 G/s: 11 ms a row; 200 MB of
    # weights at 20 GB/s: 10 ms; no attention (0 heads)
    shape = {"layer_weights": 10**9, "output_weights": 10**8, "weight_bytes": 2 * 10**8,
             "n_layer": 1, "n_head": 0, "n_head_kv": 0, "head_k": 0, "head_v": 0,
             "window": 0}  # fmt: skip
    peaks = {"threads": 2, "int8_isa": "AVX2", "int8_gmacs": 100.0, "fma_isa": "AVX2_FMA",
             "fma_gfmas": 50.0, "read_gbps": 20.0}  # fmt: skip
    setup = {"peaks": peaks, "model_shape": shape, "int8_gmacs": 42.0}
    table = floor_markdown(records, setup)
    assert "int8 multiply-adds 100.0 G/s (AVX2)" in table and "42.0 G/s" in table
    assert "| N2-doc3501-p32 | fork | 2 | 100.0 | 22.0 | int8 | 4.5 |" in table
    assert "| N2-doc3501-p32 | host | 1 | 20.0 | 11.0 | int8 | 1.8 |" in table
    slow_cpu = {**setup, "peaks": {**peaks, "read_gbps": 10.0}}  # 20 ms to read the weights
    assert "| N2-doc3501-p32 | host | 1 | 20.0 | 20.0 | read | 1.0 |" in floor_markdown(
        records, slow_cpu
    )
    assert floor_markdown(records, {}) == ""  # not measured: no table, not a made-up one


def test_scale_targets_pair_each_fork_with_its_own_baseline() -> None:
    from swarmkv_bench.metrics import speedups
    from swarmkv_bench.targets import scale_targets

    records = [
        dataclasses.replace(
            r,
            config_id="N32-D3501-P32",
            mode=r.mode.replace("host", "fork+inv").replace("baseline", "baseline+inv"),
            e2e_ms=250_000.0 if r.mode == "baseline" else 12_000.0,
            extra={"gen_ms_per_step": 20.0 if r.mode == "baseline" else 130.0},
        )
        for r in synthetic_records(configs=[(32, 3501, 32)], modes=("baseline", "host"))
    ]
    sums = summarize(records)
    got = {t.name: t for t in scale_targets(sums, speedups(sums, "baseline+inv"), records)}
    e2e = got["32 branches: fork+inv vs baseline+inv e2e"]
    assert e2e.value == pytest.approx(250 / 12) and e2e.passed
    step = got["32 branches: fork+inv step / one branch's step"]
    assert step.value == pytest.approx(6.5) and not step.passed
    assert "32 branches: fork vs baseline e2e" not in got  # the plain pair did not run


def test_a_probe_that_runs_too_long_is_a_failed_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    def too_slow(*a: Any, **kw: Any) -> None:
        raise subprocess.TimeoutExpired(cmd="probe", timeout=kw["timeout"])

    monkeypatch.setattr(subprocess, "run", too_slow)
    with pytest.raises(memprobe.SwarmKVError, match="memory probe of fork ran past"):
        memprobe.measure({"mode": "fork"}, CFG, "doc", ["q"])


def _paper_records(modes: tuple[str, ...]) -> list:
    return [
        dataclasses.replace(r, config_id="N2-D3501-P16")
        for r in synthetic_records(configs=[(2, 3501, 16)], modes=modes)
    ]


def test_paper_targets_cover_each_kernel_kind_that_ran() -> None:
    """A run of exact modes only (what `swarmkv run` does) gets its targets measured against
    baseline+inv, not listed NOT MEASURED under the plain names; a run of both gets both."""
    from swarmkv_bench.output import all_speedups
    from swarmkv_bench.targets import all_targets

    for modes, kinds in (
        (("baseline+inv", "host+inv", "fork+inv"), ("+inv",)),
        (("baseline", "host", "fork", "baseline+inv", "host+inv", "fork+inv"), ("", "+inv")),
    ):
        records = _paper_records(modes)
        run = BenchRun(BenchOptions(model_path=Path("m.gguf"), configs=(CFG,)), records=records,
                       setup=dict(SETUP))  # fmt: skip
        got = {t.name: t for t in all_targets(summarize(records), all_speedups(run), records)}
        paper = {n: t for n, t in got.items() if n.startswith("paper:")}
        assert len(paper) == 4 * len(kinds), sorted(paper)
        assert all(t.status != "NOT MEASURED" for t in paper.values()), paper
        if "+inv" in kinds:
            assert "paper: fork+inv speedup_e2e (vs baseline+inv)" in paper
        assert ("paper: fork speedup_e2e" in paper) == ("" in kinds)


def test_modes_run_in_rotated_order_and_each_is_judged_against_this_trials_baseline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    specs, _ = split_modes(["fork", "host"])
    order: list[str] = []

    class Pipe:  # a pipeline that records when it ran and returns a result of its own
        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, mode: str, keep_logits: Any) -> Any:
            order.append(self.name)
            return type("Result", (), {"branches": {}, "decode_stats": {}, "name": self.name})()

    judged: list[tuple[str, str | None]] = []

    def record(res: Any, *, baseline: Any, trial: int, **kw: Any) -> Any:
        judged.append((res.name, baseline.name if baseline is not None else None))
        return synthetic_records()[0]

    monkeypatch.setattr(runner, "from_pipeline_result", record)
    pipes: Any = {s.name: Pipe(s.name) for s in specs}
    run = _run()
    run.records = []
    for trial in (-1, 0, 1):
        runner._trial(run, CFG, trial, specs, pipes, None, {})
    names = [s.name for s in specs]
    assert order[:3] == [names[-1], *names[:-1]]  # the warm-up (trial -1) starts with the last
    assert order[3:6] == names and order[6:] == [*names[1:], names[0]]
    assert all(b == "baseline" for m, b in judged if m != "baseline")  # always, in any order
    assert [r.mode for r in run.records[:3]] == names  # recorded in declaration order
